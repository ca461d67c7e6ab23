"""The web app: the main page (/) and the teaching page (/teaching) in one Gradio Blocks, served by web.http_server.

Run: medgemma-xray [--model_path DIR] [--mode pytorch|trt] [--engine_path DIR] [--port 7860], or python app.py with
the same arguments (the operator scripts do: they know their own server by that file's path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from medgemma_xray.serving.surface import InferenceSurface
    from medgemma_xray.web.upload_cache import UploadInbox


def build_ui(service: InferenceSurface, uploads: UploadInbox | None = None):
    """Both pages, queued. uploads: the inbox that reads (and deletes) each upload once; default: Gradio's own
    upload folder (tests that build the UI without a server)."""
    from medgemma_xray.intake import FilmIntake
    from medgemma_xray.web.asking import Asking
    from medgemma_xray.web.main_page import build_main_page
    from medgemma_xray.web.teaching_page import add_teaching_page
    from medgemma_xray.web.upload_cache import UploadInbox

    if uploads is None:
        from gradio.utils import get_upload_folder

        uploads = UploadInbox(get_upload_folder())
    intake = FilmIntake.for_settings(service.settings)  # the one intake and the one Asking the API shares too
    asking = Asking.for_service(service)
    demo = build_main_page(service, uploads, intake, asking)
    add_teaching_page(demo, service, uploads, intake, asking)
    demo.queue(max_size=service.settings.queue_size, default_concurrency_limit=4)
    return demo


def main(argv: list[str] | None = None, backend_factory=None) -> int:
    """Run the server (web.http_server) with this UI. backend_factory: the service's seam for tests."""
    import threading

    from medgemma_xray.web.http_server import main as serve

    threading.current_thread().name = "main"
    return serve(argv, build_ui=build_ui, backend_factory=backend_factory)
