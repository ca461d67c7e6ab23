"""Shared fixtures: the demo checkpoint and real server processes on free loopback ports."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO_ROOT / "test-artifacts"


def _isolated_variables() -> frozenset[str]:
    """Settings a developer's shell may carry that would point a test server at someone else's files or model:
    every field of medgemma_xray.serving.settings.Settings (read from the environment by its upper-case name), plus what the
    process environment means to systemd and Gradio."""
    from dataclasses import fields

    from medgemma_xray.serving.settings import Settings

    return frozenset(spec.name.upper() for spec in fields(Settings)) | {"NOTIFY_SOCKET", "GRADIO_TEMP_DIR"}


ISOLATED_VARIABLES = _isolated_variables()


# The order in which pytest-xdist hands out files (`--dist loadfile --no-loadscope-reorder` in pyproject.toml): the
# longest first, so that the last files handed out are short ones and both workers finish together (longest
# processing time first). Without the flag, xdist hands files out by their number of tests, fewest last: the
# one-test files (the short soak, the 200 sessions, the load test: 2-3 min each) came last, and one worker ran
# them alone while the other had finished. Measured: per-file totals of `pytest --junitxml` (setup, call and
# teardown) over the whole suite, 2026-12-03 18:01-18:46 UTC, this 2-core host beside other helpers' work (load
# average 4-12); the files that need the shared INT8 build lead, so that one worker builds it while the other
# runs the longest file that needs no bundle. Files not listed follow in collection order (each under 10 s).
LONGEST_FIRST = (
    "test_operations.py",  # INT8 bundle: built here at the start
    "test_teaching_browser.py",
    "test_lifecycle.py",
    "test_front_door_conformance.py",
    "test_soak.py",
    "test_batch_films.py",
    "test_engine_status.py",  # builds the FP32 bundle
    "test_session_memory.py",
    "test_build_safety.py",
    "test_ray_cluster_security.py",
    "test_front_door_browser.py",
    "test_load.py",
    "test_ray_serve.py",
    "test_train_demo_model.py",
    "test_precisions.py",
    "test_trained_demo_model.py",
    "test_task_gate.py",
    "test_browser_case.py",
    "test_hostile_clients.py",
    "test_long_conversation_gate.py",
    "test_tensorrt_executor.py",
    "test_http_security.py",
    "test_console_log.py",
    "test_memory_bounds.py",
    "test_teaching_prior_browser.py",
    "test_login_throttle.py",
    "test_connection_budget.py",
    "test_bundle_refusal.py",
    "test_openai_api.py",
    "test_benchmark.py",
    "test_busy_server.py",
    "test_openai_conventions.py",
    "test_types.py",
    "test_systemd_unit.py",
    "test_teaching_session_memory.py",
    "test_openai_timeout.py",
    "test_gradio_upload_check.py",
    "test_container.py",
    "test_trt_inference.py",
    "test_teaching_hostile_exports.py",
    "test_log_dir.py",
    "test_browser.py",
    "test_asking.py",
    "test_prior_film.py",
    "test_decode_deadline.py",
    "test_teaching_page.py",
    "test_weight_only.py",
    "test_torch_backend.py",
    "test_regions.py",
    "test_keep_alive.py",
    "test_batch_runner.py",
    "test_first_token_and_overlap.py",
    "test_app_e2e.py",
    "test_finish_from_onnx.py",
    "test_film_check.py",
    "test_lint.py",
    "test_fused_step.py",
    "test_shared_caches.py",
    "test_progression.py",
    "test_page_wiring.py",
    "test_fuzz_loader.py",
    "test_service.py",
    "test_upload_route.py",
    "test_openai_films.py",
    "test_file_owners.py",
    "test_fast_path.py",
    "test_app_case_api.py",
    "test_openai_prior.py",
    "test_film_intake.py",
    "test_upload_cache.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        return LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests stay together and in order


def pytest_configure(config) -> None:
    """Under pytest-xdist, each worker (and every server and build it starts, which inherit the environment) gets
    its share of the cores for torch's and OpenMP's thread pools. Two workers each running torch on every core
    spin against each other: the fast loop took 4 min 40 s on 2 workers this way against 2 min 46 s on one."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // workers))


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    from medgemma_xray.demo_model.install import install_trained_checkpoint

    return install_trained_checkpoint(REPO_ROOT / "models" / "medgemma-demo")


@pytest.fixture(scope="session")
def random_model_dir() -> Path:
    """The random-weight demo checkpoint, for tests of serving mechanics that need answers that run to
    max_new_tokens (its stop tokens never win, so every answer is full length); the trained demo stops early."""
    from medgemma_xray.demo_model.build import ensure_demo_checkpoint

    return ensure_demo_checkpoint(REPO_ROOT / "models" / "medgemma-random")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen | None, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} during start-up")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen
    log_dir: Path

    @property
    def log_text(self) -> str:
        return "".join(path.read_text(errors="replace") for path in sorted(self.log_dir.glob("*.log*")))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(log_dir: Path, *extra_args: str, env: dict | None = None, script: str = "app.py") -> ServerProcess:
    """Start the real server (or a test wrapper around it, `script`) on a free loopback port; wait until ready."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    environment = {key: value for key, value in os.environ.items() if key not in ISOLATED_VARIABLES}
    environment.update({"LOG_DIR": str(log_dir), **(env or {})})
    process = subprocess.Popen(
        [sys.executable, script, "--port", str(port), "--log_file", str(log_dir / "gradio_app.log"), *extra_args],
        cwd=REPO_ROOT,
        env=environment,
        stdout=open(log_dir / "console.log", "ab"),  # noqa: SIM115 (closed with the process)
        stderr=subprocess.STDOUT,
    )
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log_dir)
    try:
        wait_ready(server.url, process)
    except Exception:
        server.stop()
        raise RuntimeError(f"server did not start; log:\n{server.log_text[-4000:]}") from None
    return server


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory, demo_model_dir) -> ServerProcess:
    server = start_server(tmp_path_factory.mktemp("server-logs"))
    yield server
    server.stop()


# The F1 gate asks 24 phantoms x 8 findings through PyTorch and the bundle: 85 of an int8 build's 122 s on this
# 2-core host (2026-12-02). Its own tests (tests/engine_build/test_task_gate.py) run it; the shared bundles, which
# other tests use for what a bundle is and does, are built without it (the manifest records it as off).
WITHOUT_THE_F1_GATE = ("--task_phantoms", "0")


def run_optimizer(*args: str, timeout_s: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "optimize_trt_engine.py", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def assert_refused_before_any_work(stderr: str) -> None:
    """The optimizer refused in its checks: its refusal line, and none of the lines of the work that follows them
    (films read, staging folder made, model loaded, steps). This holds on any machine, where a time bound held only
    on a fast, idle one."""
    assert "refused before any work" in stderr, stderr[-2000:]
    for later in ("calibration:", "building in", "[1/4]"):
        assert later not in stderr, f"{later!r} logged: the refusal came after work began\n{stderr[-2000:]}"


@pytest.fixture(scope="session")
def synthetic_films(tmp_path_factory) -> Path:
    """One folder for every worker: a bundle records the SHA-256 of the films it was calibrated on, and each
    write_phantom_set call writes new DICOM UIDs, so a bundle built by one worker refused another's folder."""
    from medgemma_xray.phantoms.films import write_phantom_set

    return built_once(tmp_path_factory, "calibration-films", lambda folder: write_phantom_set(folder, 12))


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A folder that `build(folder)` fills once per test run, however many pytest-xdist workers ask for it: the
    first builds it under a file lock in the run's common temporary folder; the others wait, then reuse it. An
    engine build takes minutes on 2 cores; a worker building its own copy would double that."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder every worker's base temp folder is made in, one per run
    folder = root / "built-once" / name
    folder.parent.mkdir(exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        marker = folder.with_name(f"{name}.built")  # beside the folder: a calibration folder is read whole
        if not marker.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way in another worker
            folder.mkdir()
            build(folder)
            marker.touch()
    return folder


@pytest.fixture(scope="session")
def int8_bundle(tmp_path_factory, demo_model_dir, synthetic_films) -> Path:
    """The CI build: demo checkpoint, synthetic films, INT8 Q/DQ, TensorRT-RTX ahead-of-time engines."""
    built = built_once(
        tmp_path_factory, "int8", lambda folder: _build_int8(folder / "demo-int8", demo_model_dir, synthetic_films)
    )
    return built / "demo-int8"


def _build_int8(bundle: Path, demo_model_dir: Path, synthetic_films: Path) -> None:
    result = run_optimizer(
        "--model_path",
        str(demo_model_dir),
        "--calib_images",
        str(synthetic_films),
        "--precision",
        "int8",
        "--output_path",
        str(bundle),
        "--target",
        "tensorrt-rtx",
        "--max_seq_len",
        "2048",  # room for the gate's long multi-turn case (1,578 tokens), at the default thresholds
        "--max_batch",
        "2",
        "--keep_fp32_onnx",
        "--allow_few_films",
        *WITHOUT_THE_F1_GATE,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    (bundle.parent / "build.log").write_text(result.stderr + result.stdout)


@pytest.fixture(scope="session")
def fp32_bundle(tmp_path_factory, demo_model_dir, synthetic_films) -> Path:
    built = built_once(
        tmp_path_factory, "fp32", lambda folder: _build_fp32(folder / "demo-fp32", demo_model_dir, synthetic_films)
    )
    return built / "demo-fp32"


def _build_fp32(bundle: Path, demo_model_dir: Path, synthetic_films: Path) -> None:
    result = run_optimizer(
        "--model_path",
        str(demo_model_dir),
        "--calib_images",
        str(synthetic_films),
        "--precision",
        "fp32",
        "--output_path",
        str(bundle),
        "--target",
        "none",
        "--max_seq_len",
        "2048",  # room for the gate's long multi-turn case
        "--max_batch",
        "2",
        "--allow_few_films",
        *WITHOUT_THE_F1_GATE,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    (bundle.parent / "build.log").write_text(result.stderr + result.stdout)
