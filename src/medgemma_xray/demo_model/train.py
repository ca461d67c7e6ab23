"""Train the demo checkpoint on labelled synthetic phantoms: a tiny Gemma3ForConditionalGeneration that answers
teaching-round questions about the film it is shown. Trained on synthetic phantoms only; not a medical model.

    python -m medgemma_xray.demo_model.train --output demo_model/trained --seed 0

Deterministic for a given seed, step count and device: fixed generators, torch.use_deterministic_algorithms, a
fixed thread count, and a data stream that is a pure function of (seed, step). The run record (config, data seed,
loss curve, held-out accuracy during training and at the end, hardware, wall time, the command) is written to
training_record.json beside the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from medgemma_xray.demo_model.auxiliary import aux_loss, box_loss, make_box_readout, make_readout
from medgemma_xray.demo_model.build import build_config, build_model, build_processor, build_tokenizer
from medgemma_xray.demo_model.dataset import (
    IGNORE_INDEX,
    ConversationTokeniser,
    TeachingData,
    TokenisedConversation,
    collate,
    tokenizer_corpus,
)

logger = logging.getLogger(__name__)

TRAINED_MODEL_ID = "medgemma-xray-demo (synthetic phantoms, not a medical model)"
TRAINED_WARNING = (
    "Trained on synthetic phantoms only; not a medical model. It answers about drawn findings on phantom films "
    "and means nothing on a real radiograph. Not for clinical use."
)
RECORD_FILE = "training_record.json"
SAVE_RESERVE_S = 15.0  # what --schedule_by_time keeps of --max_train_s for the last probe and the save
# As small as still learns, so the CPU demo stays responsive. The vision tower keeps MedGemma's geometry (896 px,
# patch 14: 4096 patches pooled to 256 image tokens); one layer is enough for the phantoms' findings.
TEXT_CONFIG = dict(
    hidden_size=192,
    intermediate_size=576,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=48,
    query_pre_attn_scalar=48,  # = head_dim, as in MedGemma (256 and 256); the default 256 would flatten attention
    sliding_window=512,
    layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    max_position_embeddings=8192,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
)
VISION_CONFIG = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=896,
    patch_size=14,
    vision_use_head=False,
)


def configure_determinism(seed: int, threads: int, device: str) -> None:
    import torch

    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for deterministic matmuls
        # A few CUDA backward kernels (scatter-adds) have no deterministic variant: warn rather than stop, and the
        # record says a CUDA run is repeatable only up to them.
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)


def hidden_states(model, batch, device):
    """The language model's last hidden states for a batch, and the image features. Each film goes through the
    vision tower once; its 256 image features fill the image tokens of every conversation about it (what the
    model's own forward does for one sequence with its pixel values)."""
    input_ids = batch.input_ids.to(device)
    features = model.model.get_image_features(pixel_values=batch.pixel_values.to(device)).pooler_output
    embeds = model.get_input_embeddings()(input_ids)
    image_mask = (input_ids == model.config.image_token_id).unsqueeze(-1)
    embeds = embeds.masked_scatter(image_mask, features[batch.image_index.to(device)].to(embeds.dtype))
    hidden = model.model(
        inputs_embeds=embeds,
        attention_mask=batch.attention_mask.to(device),
        token_type_ids=batch.token_type_ids.to(device),
    ).last_hidden_state
    return hidden, features


def answer_loss(model, batch, device, per_task: dict | None = None):
    """Cross-entropy on the answer tokens only (labels are -100 elsewhere), and the image features. Written with
    a one-hot product rather than nll_loss, which has no deterministic CUDA kernel. per_task, if given, gets each
    task's mean loss over its answer tokens (batch.tasks names each sequence's task), for the log."""
    import torch.nn.functional as F

    hidden, features = hidden_states(model, batch, device)
    targets = batch.labels.to(device)[:, 1:]
    selected = targets != IGNORE_INDEX
    logits = model.lm_head(hidden[:, :-1][selected]).float()
    one_hot = F.one_hot(targets[selected], num_classes=logits.shape[-1]).to(logits.dtype)
    token_loss = -(F.log_softmax(logits, dim=-1) * one_hot).sum(dim=-1)
    if per_task is not None and batch.tasks:
        rows = selected.nonzero()[:, 0].cpu()
        detached = token_loss.detach().cpu()
        for task in sorted(set(batch.tasks)):
            in_task = [index for index, name in enumerate(batch.tasks) if name == task]
            chosen = (rows.unsqueeze(1) == rows.new_tensor(in_task).unsqueeze(0)).any(dim=1)
            if bool(chosen.any()):
                per_task[task] = float(detached[chosen].mean())
    return token_loss.mean(), features


def first_token_accuracy(model, processor, phantoms, device, readout=None) -> dict:
    """Held-out accuracy of the answer's first word (Yes/No) to each finding's canonical question, teacher-forced:
    a cheap figure to watch during training (the final figures come from real generation)."""
    import torch

    from medgemma_xray.phantoms.findings import FINDINGS
    from medgemma_xray.phantoms.questions import FINDING_QUESTIONS

    tokeniser = ConversationTokeniser(processor)
    yes, no = (processor.tokenizer.convert_tokens_to_ids(word) for word in ("Yes", "No"))
    hits = dict.fromkeys(FINDINGS, 0)
    readout_hits = dict.fromkeys(FINDINGS, 0)
    model.eval()
    with torch.no_grad():
        for phantom in phantoms:
            sequences = []
            for finding in FINDINGS:
                ids = tokeniser.ids([(FINDING_QUESTIONS[finding][0], None)], add_generation_prompt=True)
                sequences.append(TokenisedConversation(ids, [IGNORE_INDEX] * len(ids)))
            batch = collate(processor, [phantom.image], sequences, [0] * len(sequences), tokeniser.image_token_id)
            hidden, features = hidden_states(model, batch, device)
            if readout is not None:
                scores = readout(features[:1])[0, 0]  # the attention-pooled read-out of this film
                for index, finding in enumerate(FINDINGS):
                    readout_hits[finding] += int(bool(scores[index] > 0) == phantom.labels.present(finding))
            last = (batch.attention_mask.sum(dim=1) - 1).to(device)
            logits = model.lm_head(hidden[torch.arange(len(sequences), device=device), last])
            for row, finding in enumerate(FINDINGS):
                said_yes = bool(logits[row, yes] > logits[row, no])
                hits[finding] += int(said_yes == phantom.labels.present(finding))
    model.train()
    accuracy: dict[str, float | dict[str, float]] = {finding: hits[finding] / len(phantoms) for finding in FINDINGS}
    if readout is not None:
        accuracy["readout"] = {finding: readout_hits[finding] / len(phantoms) for finding in FINDINGS}
    return accuracy


def designed_patch_filters(hidden_size: int, patch_size: int, generator):
    """Patch-embedding filters that start out reading what the phantoms' findings are made of: local brightness
    (four quadrants), edges, thin bright lines in four directions (tubes, catheters, pleural lines) and a blob
    detector, then random filters for the rest. Identical on the three (grey) channels."""
    import torch

    size = patch_size
    grid = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")
    designed = []
    for qy in (yy < 0, yy >= 0):
        for qx in (xx < 0, xx >= 0):
            quadrant = (qy & qx).float()
            designed.append(quadrant / quadrant.sum())
    designed += [torch.sign(xx) / size**2 * 2, torch.sign(yy) / size**2 * 2]
    for distance in (xx.abs(), yy.abs(), (xx - yy).abs() / 2**0.5, (xx + yy).abs() / 2**0.5):
        line = (distance < 1.5).float()
        designed.append(line / line.sum() - (1 - line) / (1 - line).sum())
    disk = (xx**2 + yy**2 < 9).float()
    designed.append(disk / disk.sum() - (1 - disk) / (1 - disk).sum())
    filters = torch.empty(hidden_size, 3, size, size)
    filters.normal_(0.0, 1.0 / (3 * size * size) ** 0.5, generator=generator)
    for index, kernel in enumerate(designed[:hidden_size]):
        filters[index] = 4.0 * kernel / 3  # summed over 3 channels; a strong response dominates the random bias
    return filters


def sincos_positions(side: int, width: int):
    """2-D sine/cosine codes of each patch's row and column (MAE's fixed embedding), one row per patch."""
    import math

    import torch

    grid = torch.arange(side, dtype=torch.float32)
    rows, cols = torch.meshgrid(grid, grid, indexing="ij")
    codes = []
    for k in range(math.ceil(width / 4)):
        frequency = math.pi / side * 2 ** (k / 2)  # from one half-wave across the film to a few patches
        for axis in (rows, cols):
            codes += [torch.sin(axis * frequency), torch.cos(axis * frequency)]
    return torch.stack(codes[:width], dim=-1).reshape(side * side, width)


def _probe(model, processor, phantoms, device, readout, step: int) -> dict:
    """One held-out probe for the record and the log."""
    accuracy = first_token_accuracy(model, processor, phantoms, device, readout)
    read = accuracy.pop("readout")
    mean = sum(accuracy.values()) / len(accuracy)
    logger.info(
        "step %d held-out first-token accuracy %.3f %s; read-out %s",
        step,
        mean,
        {k: round(v, 2) for k, v in accuracy.items()},
        {k: round(v, 2) for k, v in read.items()},
    )
    return {"step": step, "first_token_accuracy": accuracy, "readout_accuracy": read, "mean": mean}


def prepare_for_training(model, seed: int) -> None:
    """Start the vision tower where the phantoms' findings are visible to it, and easy to train:
    - designed patch filters (brightness, edges, lines, blobs);
    - a random patch bias of the same scale: the patch embedding is linear in the pixels, so without it LayerNorm
      would keep only whether a flat patch is above mid grey, not how bright it is;
    - smooth 2-D sine/cosine position embeddings, so every image token says where on the film it lies and the
      language model can learn to look at a region (the neck for a tube, a lung base for an effusion);
    - the encoder layer's residual branches (attention output, MLP output) start at zero, so the layer starts as
      the identity and learns what to add (the usual zero-init residual for training from scratch)."""
    import torch

    generator = torch.Generator().manual_seed(seed + 3)
    vision = model.model.vision_tower
    embeddings = vision.embeddings
    with torch.no_grad():
        config = model.config.vision_config
        embeddings.patch_embedding.weight.copy_(
            designed_patch_filters(config.hidden_size, config.patch_size, generator)
        )
        embeddings.patch_embedding.bias.normal_(0.0, 0.5, generator=generator)
        side = config.image_size // config.patch_size
        embeddings.position_embedding.weight.copy_(sincos_positions(side, config.hidden_size))
        for layer in vision.encoder.layers:
            layer.self_attn.out_proj.weight.zero_()
            layer.mlp.fc2.weight.zero_()


def load_parent(parent: Path, tokenizer):
    """The trained checkpoint that --init_from continues: its weights in fp32, after checking that it is a demo
    checkpoint with this code's architecture and this run's tokenizer (a run that continued from another vocabulary
    or shape would train nonsense and still write a checkpoint)."""
    import torch
    from transformers import Gemma3ForConditionalGeneration, PreTrainedTokenizerFast

    from medgemma_xray.demo_model.build import is_demo_checkpoint

    if not is_demo_checkpoint(parent) or not (parent / RECORD_FILE).is_file():
        raise SystemExit(
            f"--init_from {parent}: not a trained demo checkpoint (no demo marker or {RECORD_FILE}); "
            "give the folder that `python -m medgemma_xray.demo_model.train --output FOLDER` wrote"
        )
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(parent / "tokenizer.json")).get_vocab()
    if theirs != tokenizer.get_vocab():
        raise SystemExit(
            f"--init_from {parent}: its tokenizer differs from the one this code builds with --vocab_size "
            f"{len(tokenizer)} ({len(theirs)} tokens there); continue with the --vocab_size it was trained with"
        )
    model = Gemma3ForConditionalGeneration.from_pretrained(parent, dtype=torch.float32)
    shape = {key: getattr(model.config.text_config, key) for key in TEXT_CONFIG if key != "rope_scaling"}
    expected = {key: value for key, value in TEXT_CONFIG.items() if key != "rope_scaling"}
    if shape != expected:
        raise SystemExit(f"--init_from {parent}: its text config {shape} is not this code's {expected}")
    return model


def parent_summary(parent: Path) -> list[dict]:
    """The lineage a continued run carries in its record: each earlier run's command, code, steps and wall time, so
    the checkpoint can be remade run by run."""
    record = json.loads((parent / RECORD_FILE).read_text())
    own = {
        "command": record.get("command"),
        "code_commit": record.get("code_commit"),
        "steps_run": record.get("stopped_early_at_step") or record.get("steps"),
        "train_wall_s": record.get("train_wall_s"),
        "hardware": record.get("hardware"),
        "held_out_macro_f1": record.get("held_out_eval", {}).get("macro_f1"),
    }
    return [*record.get("continued_from", []), own]


def learning_rate(step: int, steps: int, warmup: int, peak: float, time_progress: float = 0.0) -> float:
    """Linear warm-up, then a cosine down to a tenth of the peak. time_progress (0..1, the share of a time budget
    spent) moves the cosine on when it is ahead of the steps, so a run with a wall-clock budget still ends annealed
    however fast its machine is (--schedule_by_time)."""
    import math

    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(max((step - warmup) / max(steps - warmup, 1), time_progress), 1.0)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))  # cosine down to a tenth


def hardware(device: str) -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": device,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
    else:
        cpu = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        info["cpu"] = cpu[0].split(":", 1)[1].strip() if cpu else platform.processor()
        info["cpu_count"] = os.cpu_count()
    return info


def git_commit() -> str | None:
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "demo_model", "phantoms"], capture_output=True, text=True, timeout=10
        )
        return result.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def train(args: argparse.Namespace) -> dict:
    import torch

    from medgemma_xray.phantoms.evaluation import held_out_phantoms

    started = time.perf_counter()
    configure_determinism(args.seed, args.threads, args.device)
    tokenizer = build_tokenizer(tokenizer_corpus(), vocab_size=args.vocab_size, split_digits=True)
    processor = build_processor(tokenizer)
    for word in ("Yes", "No"):
        if tokenizer.convert_tokens_to_ids(word) == tokenizer.unk_token_id:
            raise RuntimeError(f"the tokenizer has no single token for {word!r}; the accuracy probe needs one")
    # Drawn before the model reaches the GPU: the pool's workers are forked from this process.
    data = TeachingData(
        processor,
        args.seed,
        args.films_per_step,
        args.pool_films,
        args.variants,
        args.workers,
        pool_pairs=args.pool_pairs,
        pairs_per_step=args.pairs_per_step,
        extra_films=args.extra_films,
        extra_with=args.extra_with,
    )
    logger.info(
        "film pool: %d films x %d variants, %d progression pairs ready (%.0f s)",
        len(data.films),
        args.variants,
        len(data.pairs),
        time.perf_counter() - started,
    )
    config = build_config(len(tokenizer), TEXT_CONFIG, VISION_CONFIG)
    if args.init_from:
        model = load_parent(args.init_from, tokenizer)
        config = model.config
    else:
        model = build_model(config, seed=args.seed)
        prepare_for_training(model, args.seed)
    if args.attention != "sdpa":
        model.set_attn_implementation(args.attention)  # eager: plain matmul + softmax, deterministic on CUDA
    model = model.to(args.device).train()
    readout = make_readout(config.text_config.hidden_size, args.seed + 2).to(args.device)
    box_readout = make_box_readout(config.text_config.hidden_size, args.seed + 4).to(args.device)
    vision = [p for n, p in model.named_parameters() if "vision_tower" in n or "multi_modal_projector" in n]
    vision_ids = {id(p) for p in vision}
    text = [p for p in model.parameters() if id(p) not in vision_ids]
    optimizer = torch.optim.AdamW(
        [
            {"params": text, "peak": args.lr},
            {"params": vision, "peak": args.vision_lr},
            {"params": [*readout.parameters(), *box_readout.parameters()], "peak": args.readout_lr},
        ],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
        weight_decay=0.0,
    )
    probe = held_out_phantoms(args.probe_phantoms, start_seed=args.probe_start)
    curve, probes = [], []
    window = []
    stopped_early = None
    loop_started = time.perf_counter()
    # The share of the training budget spent, for --schedule_by_time: the budget is what --max_train_s leaves after
    # the pool was drawn, less SAVE_RESERVE_S for the last probe and the save.
    budget = args.max_train_s - (loop_started - started) - SAVE_RESERVE_S if args.max_train_s else 0.0
    if args.schedule_by_time and budget <= 0:
        raise RuntimeError("--schedule_by_time needs a --max_train_s that leaves time after drawing the pool")
    for step in range(args.steps):
        spent = (time.perf_counter() - loop_started) / budget if args.schedule_by_time else 0.0
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.warmup, group["peak"], spent)
        if args.schedule_by_time and spent >= 1.0:
            stopped_early = step
            logger.warning("stopping at step %d: the time budget is spent (the schedule has annealed)", step)
            break
        if args.max_train_s and time.perf_counter() - started > args.max_train_s:
            stopped_early = step
            logger.warning("stopping at step %d: past --max_train_s %.0f", step, args.max_train_s)
            break
        batch = data.batch(step, args.device)
        task_losses: dict[str, float] = {}
        loss, features = answer_loss(model, batch, args.device, task_losses)
        auxiliary = aux_loss(readout, features, batch.film_labels)
        boxes = box_loss(box_readout, features, batch.film_boxes)
        optimizer.zero_grad(set_to_none=True)
        (loss + args.aux_weight * auxiliary + args.box_weight * boxes).backward()
        torch.nn.utils.clip_grad_norm_([*model.parameters(), *readout.parameters(), *box_readout.parameters()], 1.0)
        optimizer.step()
        window.append((float(loss.detach()), float(auxiliary.detach()), float(boxes.detach()), task_losses))
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            tasks = sorted({task for w in window for task in w[3]})
            task_loss = {
                task: sum(w[3][task] for w in window if task in w[3]) / sum(1 for w in window if task in w[3])
                for task in tasks
            }
            curve.append(
                {
                    "step": step + 1,
                    "loss": sum(w[0] for w in window) / len(window),
                    "aux_loss": sum(w[1] for w in window) / len(window),
                    "box_loss": sum(w[2] for w in window) / len(window),
                    "task_loss": task_loss,
                    "elapsed_s": round(time.perf_counter() - started, 1),
                }
            )
            window = []
            logger.info(
                "step %d/%d loss %.4f aux %.4f box %.4f tasks %s (%.0f s)",
                step + 1,
                args.steps,
                curve[-1]["loss"],
                curve[-1]["aux_loss"],
                curve[-1]["box_loss"],
                {task: round(value, 4) for task, value in task_loss.items()},
                curve[-1]["elapsed_s"],
            )
        if args.probe_every and ((step + 1) % args.probe_every == 0 or step + 1 == args.steps):
            probes.append(_probe(model, processor, probe, args.device, readout, step + 1))
    if args.probe_every and stopped_early and (not probes or probes[-1]["step"] != stopped_early):
        probes.append(_probe(model, processor, probe, args.device, readout, stopped_early))  # where it stopped
    return {
        "model": model.eval(),
        "processor": processor,
        "config": config,
        "curve": curve,
        "probes": probes,
        "train_s": time.perf_counter() - started,
        "stopped_early_at_step": stopped_early,
    }


def save(result: dict, args: argparse.Namespace, argv: list[str]) -> Path:
    from medgemma_xray.demo_model.build import save_checkpoint

    model = result["model"].to("cpu")
    marker = {
        "model_id": TRAINED_MODEL_ID,
        "warning": TRAINED_WARNING,
        "trained_on": "synthetic phantoms only (medgemma_xray.phantoms.labelled); not a medical model",
        "seed": args.seed,
        "training_record": RECORD_FILE,
    }
    if args.pool_pairs and args.pairs_per_step:
        # It was taught "Where is ...?" (every film) and "what changed?" (the pairs): the checkpoint profile reads
        # these (engine_bundle.checkpoint_profile), so the UI offers both.
        marker["capabilities"] = ["localisation", "longitudinal"]
    save_checkpoint(model, result["processor"], args.output, marker)
    return args.output


def evaluate(args: argparse.Namespace) -> dict:
    """Held-out task accuracy through the serving backend itself (real greedy generation), on CPU."""
    from medgemma_xray.phantoms.evaluation import held_out_phantoms, task_accuracy
    from medgemma_xray.pytorch_backend.eager import TorchInference

    backend = TorchInference(args.output, device="cpu")
    try:
        started = time.perf_counter()
        result = task_accuracy(backend, held_out_phantoms(args.eval_phantoms, start_seed=args.eval_start))
        result["wall_s"] = round(time.perf_counter() - started, 1)
    finally:
        backend.close()
    return result


def held_out_record(evaluation: dict, args: argparse.Namespace) -> dict:
    """What the run record keeps of an evaluation: the figures, the seeds and a few answers to read."""
    kept = {k: v for k, v in evaluation.items() if k != "answers"}
    kept["seeds"] = f"{args.eval_start}..{args.eval_start + args.eval_phantoms - 1}"
    kept["sample_answers"] = evaluation["answers"][:16]
    kept["wrong_answers"] = [answer for answer in evaluation["answers"] if not answer["correct"]]  # few; to read
    return kept


def write_record(result: dict, evaluation: dict | None, args: argparse.Namespace, argv: list[str], total_s: float):
    reproduce = "python -m medgemma_xray.demo_model.train " + " ".join(shlex.quote(a) for a in argv)
    record = {
        "model_id": TRAINED_MODEL_ID,
        "notice": TRAINED_WARNING,
        "command": reproduce,
        "code_commit": git_commit(),
        "arguments": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "data": {
            "generator": (
                "medgemma_xray.phantoms.labelled.labelled_phantom + phantoms.regions + phantoms.progression + "
                "medgemma_xray.demo_model.teaching + demo_model.pointing"
            ),
            "pool_pairs": args.pool_pairs,
            "pairs_per_step": args.pairs_per_step,
            "pair_seeds": "TRAIN_SEED_BASE + seed * 1e8 + PAIR_SEED_OFFSET (5e7) + index",
            "data_seed": args.seed,
            "pool_films": args.pool_films,
            "extra_films": args.extra_films,
            "extra_with": list(args.extra_with),
            "conversation_variants": args.variants,
            "film_visits": args.steps * args.films_per_step,
            "film_seeds": "TRAIN_SEED_BASE + seed * 1e8 + index, index < pool_films (held-out seeds are < 1e6); "
            "extra films: the first seeds from TRAIN_SEED_BASE + seed * 1e8 + EXTRA_SEED_OFFSET (2e7) up whose labels "
            "hold one of extra_with",
        },
        "model_config": {
            "text": TEXT_CONFIG,
            "vision": VISION_CONFIG,
            "vocab_size": result["config"].text_config.vocab_size,
            "parameters": sum(p.numel() for p in result["model"].parameters()),
        },
        **({"continued_from": parent_summary(args.init_from)} if args.init_from else {}),
        "steps": args.steps,
        "stopped_early_at_step": result["stopped_early_at_step"],
        "loss_curve": result["curve"],
        "held_out_first_token_accuracy": result["probes"],
        "hardware": hardware(args.device),
        "train_wall_s": round(result["train_s"], 1),
        "total_wall_s": round(total_s, 1),
    }
    if evaluation is not None:
        record["held_out_eval"] = held_out_record(evaluation, args)
    (args.output / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")


def add_evaluation(args: argparse.Namespace, argv: list[str]) -> int:
    """Held-out figures for a checkpoint trained elsewhere (the H200): real generation on this CPU, written into its
    record with the command that produced them."""
    from medgemma_xray.phantoms.evaluation import format_table

    record_path = args.output / RECORD_FILE
    record = json.loads(record_path.read_text())
    evaluation = evaluate(args)
    record["held_out_eval"] = held_out_record(evaluation, args)
    record["held_out_eval"]["command"] = "python -m medgemma_xray.demo_model.train " + " ".join(
        shlex.quote(a) for a in argv
    )
    record["held_out_eval"]["hardware"] = hardware("cpu")
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    print(format_table({"pytorch": evaluation}))
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="checkpoint folder (created)")
    parser.add_argument(
        "--evaluate_only",
        action="store_true",
        help="do not train: evaluate the checkpoint in --output on CPU and add the figures to its training record",
    )
    parser.add_argument("--seed", type=int, default=0, help="data and initialisation seed")
    parser.add_argument(
        "--init_from",
        type=Path,
        default=None,
        help="continue training a checkpoint this command wrote (its weights; new read-outs, optimiser and schedule; "
        "--seed then picks the data only); the record keeps the earlier runs' commands",
    )
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--films_per_step", type=int, default=8)
    parser.add_argument("--pool_films", type=int, default=64, help="training films, drawn once (seeds from 1e6 up)")
    parser.add_argument(
        "--extra_films",
        type=int,
        default=0,
        help="this many more training films, each holding one of --extra_with (a pool tilted to those findings)",
    )
    parser.add_argument(
        "--extra_with",
        type=lambda text: tuple(name for name in text.split(",") if name),
        default=(),
        help="comma-separated findings (phantoms.findings.FINDINGS) that select the --extra_films",
    )
    parser.add_argument("--variants", type=int, default=4, help="conversation variants per film (one per epoch)")
    parser.add_argument("--workers", type=int, default=1, help="processes that draw the pool (same pool for any)")
    parser.add_argument(
        "--attention",
        choices=["sdpa", "eager"],
        default="eager",
        help="attention kernels while training: eager (deterministic on CUDA: two H200 runs bit-identical) or sdpa "
        "(what trained the committed checkpoint; its CUDA backward is not deterministic)",
    )
    parser.add_argument("--max_train_s", type=float, default=0, help="stop training past this many seconds (0: off)")
    parser.add_argument(
        "--schedule_by_time",
        action="store_true",
        help="anneal the learning rate by the share of --max_train_s spent when that is ahead of the steps, and stop "
        "when it is spent (a one-shot run on a machine of unknown speed ends annealed; not repeatable step for step)",
    )
    parser.add_argument("--lr", type=float, default=5e-3, help="peak learning rate of the language model")
    parser.add_argument("--vision_lr", type=float, default=5e-3, help="peak learning rate of vision + projector")
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--aux_weight", type=float, default=1.0, help="weight of the label read-out loss (0: off)")
    parser.add_argument("--readout_lr", type=float, default=1e-2, help="peak learning rate of the read-outs")
    parser.add_argument("--box_weight", type=float, default=1.0, help="weight of the box read-out loss (0: off)")
    parser.add_argument("--pool_pairs", type=int, default=8, help="progression pairs, drawn once (0: no pairs)")
    parser.add_argument("--pairs_per_step", type=int, default=2, help="progression pairs in each step's batch")
    parser.add_argument("--vocab_size", type=int, default=1024)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the record names it; results differ)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (fixed, for reproducible sums)")
    parser.add_argument("--log_every", type=int, default=10)
    parser.add_argument("--probe_every", type=int, default=100, help="steps between held-out probes (0: none)")
    parser.add_argument("--probe_phantoms", type=int, default=48)
    parser.add_argument("--probe_start", type=int, default=500_000, help="first held-out seed of the probe set")
    parser.add_argument("--eval_phantoms", type=int, default=100, help="final held-out evaluation (0: skip)")
    parser.add_argument("--eval_start", type=int, default=0, help="first held-out seed of the final evaluation")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.evaluate_only:
        return add_evaluation(args, argv)
    import torch

    # Determinism is process-wide (and makes torch fill new tensors with NaN): give it back as it was, so a caller
    # in the same process (the tests) is not left running under it.
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.get_num_threads(),
    )
    try:
        return _train_and_save(args, argv)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.set_num_threads(previous[2])


def _train_and_save(args: argparse.Namespace, argv: list[str]) -> int:
    started = time.perf_counter()
    if args.init_from and args.init_from.resolve() == args.output.resolve():
        raise SystemExit("--init_from and --output are the same folder: write the continued run to a new one")
    result = train(args)
    save(result, args, argv)
    evaluation = evaluate(args) if args.eval_phantoms else None
    write_record(result, evaluation, args, argv, time.perf_counter() - started)
    if evaluation is not None:
        from medgemma_xray.phantoms.evaluation import format_table

        print(format_table({"pytorch": evaluation}))
    print(f"trained demo checkpoint written to {args.output} ({TRAINED_MODEL_ID})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
