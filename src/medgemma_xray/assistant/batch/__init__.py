"""Batch work over folders of films: features, structured reports, questions, DICOM to PNG; resumable after kill -9.

journal: the results JSONL (append + fsync, torn-tail recovery). features: embedding shards and their index.
films: finding films and naming them without their file names. tasks: one film's records. runner: the loop, its
progress bar and summary. csv_view: the CSV regenerated from the JSONL. dicom_png: de-identified conversion.
"""
