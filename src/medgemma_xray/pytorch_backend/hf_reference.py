"""transformers' own path for a request: the processor's tensors and generate()'s greedy tokens. What backends match."""

from __future__ import annotations

from medgemma_xray.inference_api.chat import chat_messages


def hf_inputs(backend, request):
    """The processor's own tensors for a request (apply_chat_template with the image)."""
    return backend.processor.apply_chat_template(
        chat_messages(request), add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )


def hf_generate(backend, request) -> tuple[list[int], list[float]]:
    """Greedy tokens of model.generate() (stop token removed) and each token's log-probability."""
    import torch

    inputs = hf_inputs(backend, request).to(backend.device, dtype=backend.dtype)
    with torch.inference_mode():
        output = backend.model.generate(
            **inputs,
            max_new_tokens=request.max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = output.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    logprobs = [
        float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(output.logits, tokens, strict=False)
    ]
    while tokens and tokens[-1] in backend.stop_token_ids:
        tokens.pop()
    return tokens, logprobs[: len(tokens)]
