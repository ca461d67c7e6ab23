"""ONNX Runtime's thread pools follow OMP_NUM_THREADS, the one knob torch and numpy already read: an operator who
gives the server one core (or a test worker given its share) gets one thread per session, not one per core of the
host, each spinning between runs against the other work on the machine."""

from __future__ import annotations

import json
import os

from medgemma_xray.trt_inference.runtime.onnx_executor import OnnxRuntimeExecutor


def os_threads() -> set[str]:
    """This process's OS thread ids. A test compares sets, not counts: a thread left by an earlier test in the same
    pytest worker may end meanwhile (a count of 8 became 7 once, on a fresh clone, 2026-12-02)."""
    return set(os.listdir("/proc/self/task"))


def test_one_thread_asked_one_thread_given(int8_bundle, monkeypatch):
    manifest = json.loads((int8_bundle / "manifest.json").read_text())
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = os_threads()
    executor = OnnxRuntimeExecutor(int8_bundle, manifest)
    assert len(executor.sessions) == 3
    assert os_threads() - before == set()  # no intra-op pool: each session runs on the calling thread


def test_without_the_setting_the_cores_this_process_may_use(monkeypatch):
    from medgemma_xray.trt_inference.runtime.onnx_executor import cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cpu_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "not-a-number")
    assert cpu_threads() == len(os.sched_getaffinity(0))
