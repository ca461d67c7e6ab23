"""Start the server: python app.py [--model_path DIR] [--mode pytorch|trt] [--engine_path DIR] [--port 7860].

The same as the `medgemma-xray` command. The operator scripts start this file by its absolute path and know their
own server by it (scripts/lib.sh), so it stays here, one call long.
"""

from medgemma_xray.web.app import main

if __name__ == "__main__":
    raise SystemExit(main())
