"""Build an engine bundle: python optimize_trt_engine.py --model_path DIR --calib_images DIR --output_path DIR.

The same as the `medgemma-xray-build-engine` command (medgemma_xray.cli.build_engine, whose --help says everything).
"""

from medgemma_xray.cli.build_engine import main

if __name__ == "__main__":
    raise SystemExit(main())
