"""Batch work over a folder of films: python batch_films.py --task all --input films/ --output results/.

The same as the `medgemma-xray-batch` command (medgemma_xray.cli.batch, whose --help says everything).
"""

from medgemma_xray.cli.batch import main

if __name__ == "__main__":
    raise SystemExit(main())
