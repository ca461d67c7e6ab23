"""Scale-out on Ray Serve: one model replica per GPU behind one ingress that serves the UI and the OpenAI API.

Ray is an optional extra (pip install -c constraints.txt -e '.[ray]'); nothing outside this package imports it, and this package imports
it only inside the functions that need it. deploy/ray/ holds the application configs (`serve run` / `serve deploy`).
"""
