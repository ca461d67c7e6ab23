"""A bundle served on ONNX Runtime gives a long prompt's memory back once its conversation is gone.

ONNX Runtime's CPU arena kept every chunk a prefill had needed until the session closed: after one answer to a
1,884-token prompt, with its conversation forgotten and glibc's free memory trimmed, the process kept 142 MiB more
RSS than after a short prompt (this test's child on the soak's bundle, 2026-12-03), so each bundle session sat at
the high-water mark of its longest prompt and the one-hour soak's RSS rose with every bundle phase. The executor
now asks the arena to shrink after prompt and vision runs: 17 MiB kept. Measured in a fresh child process, in
bytes, never in time.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT

KEPT_LIMIT_MIB = 60  # on the demo bundle: 17 MiB with the arena's shrinkage, 142 MiB without

CHILD = """
import gc, json, sys
from PIL import Image
from medgemma_xray.inference_api.contract import ChatTurn, GenerationRequest
from medgemma_xray.phantoms.films import chest_phantom
from medgemma_xray.serving.memory import return_freed_memory
from medgemma_xray.trt_inference.trt_model import TRTInference

def rss_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))

backend = TRTInference(sys.argv[1], require_verified=False, executor="onnxruntime-cpu")
film = Image.fromarray(chest_phantom(seed=0)).convert("RGB")

def answer(repeats, conversation):
    request = GenerationRequest(film, (ChatTurn("user", "findings? " * repeats),), max_new_tokens=1,
                                conversation_id=conversation)
    backend.generate(request)
    backend.forget(conversation)  # the conversation's own KV goes: what stays is the process's, not the case's
    gc.collect()
    return_freed_memory()  # glibc's free lists trimmed, as the server does: what stays is what the arena holds
    return backend.prompt_length(request)

answer(1, "short")
before = rss_mib()
tokens = answer(800, "long")
print(json.dumps({"prompt_tokens": tokens, "kept_mib": rss_mib() - before}))
"""


def test_a_long_prompts_arena_chunks_are_given_back(int8_bundle):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(int8_bundle)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["prompt_tokens"] > 1500  # long enough that its attention needs far more than the limit
    assert measured["kept_mib"] < KEPT_LIMIT_MIB, (
        f"after one answer to a {measured['prompt_tokens']}-token prompt, its conversation forgotten, the process "
        f"kept {measured['kept_mib']:.1f} MiB more RSS: the ONNX Runtime arena held the prefill's chunks"
    )
