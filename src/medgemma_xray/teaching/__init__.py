"""Teaching rounds: guess first then reveal, a windowing viewer, a case library, and a session a teacher keeps.

Logic only (no Gradio): scoring of reads against an answer key (keys, scoring, model_read), the case library
(library), the viewer's rendering and measurements (viewer), the session's CSV/PDF export (session_export), the
report's clinical context (report_context) and the DICOM Basic Text SR export (sr). The UI is web/teaching_page.py.
"""
