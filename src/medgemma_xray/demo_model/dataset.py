"""Training batches for the demo model: labelled phantoms through the serving preprocessing, their teaching-round
conversations tokenised with the processor's own chat template, and labels on the answer tokens only.

Each film is encoded by the vision tower once per step and shared by three conversations about it (every finding
question; whole-film questions such as the structured report; "Where is the ...?" in MedGemma 1.5's localisation
format), so one expensive image pass teaches a dozen answers. Progression pairs add conversations with two films
in one user turn (the prior, then the current film, then the comparison prompt), the longitudinal notebook's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from medgemma_xray.demo_model import teaching
from medgemma_xray.inference_api.contract import SYSTEM_PROMPT
from medgemma_xray.phantoms.evaluation import TRAIN_SEED_BASE
from medgemma_xray.phantoms.findings import FINDINGS, PhantomLabels, sample_labels
from medgemma_xray.phantoms.questions import FINDING_QUESTIONS

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100


@dataclass
class TokenisedConversation:
    input_ids: list[int]
    labels: list[int]  # IGNORE_INDEX except on the assistant's answer tokens and their <end_of_turn>


@dataclass
class Batch:
    """Tensors for one step. pixel_values holds each film once; image_index[j] is the film of the j-th run of image
    tokens in the batch, reading the sequences in row order (one run per single-film sequence, two for a pair's:
    the prior, then the current film)."""

    pixel_values: object  # torch.FloatTensor (films, 3, 896, 896)
    input_ids: object  # torch.LongTensor (sequences, length), right-padded
    attention_mask: object
    token_type_ids: object  # 1 on image soft tokens, as the processor returns them
    labels: object
    image_index: object
    answer_tokens: int
    film_labels: list = field(default_factory=list)  # each film's PhantomLabels (the auxiliary targets)
    film_boxes: list = field(default_factory=list)  # each film's ground-truth boxes, model frame (aux targets)
    tasks: list = field(default_factory=list)  # each sequence's task: "findings", "overview", "locate", "compare"


def chat(turns: Sequence[tuple[str, str | None]], images: int = 1) -> list[dict]:
    """Messages as the serving layer builds them (medgemma_xray.inference_api.chat.chat_messages): system prompt, the
    film (or the prior and the current film: images=2) in the first user turn. An answer of None leaves the
    conversation open at that question."""
    messages: list[dict] = [{"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]}]
    for index, (question, answer) in enumerate(turns):
        content: list[dict] = [{"type": "image"} for _ in range(images)] if index == 0 else []
        content.append({"type": "text", "text": question})
        messages.append({"role": "user", "content": content})
        if answer is not None:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": answer}]})
    return messages


class ConversationTokeniser:
    """The processor's chat template and image-token expansion, without re-processing the film per conversation."""

    def __init__(self, processor) -> None:
        self.processor = processor
        tokenizer = processor.tokenizer
        self.tokenizer = tokenizer
        self.start_of_turn = tokenizer.convert_tokens_to_ids("<start_of_turn>")
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
        self.image_token_id = tokenizer.convert_tokens_to_ids(tokenizer.image_token)
        self.model_header = tokenizer("model\n", add_special_tokens=False)["input_ids"]

    def ids(
        self, turns: Sequence[tuple[str, str | None]], add_generation_prompt: bool = False, images: int = 1
    ) -> list[int]:
        text = self.processor.apply_chat_template(
            chat(turns, images), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        # What Gemma3Processor does to the text when it is given the films: each <start_of_image> becomes the
        # 256 image soft tokens between their markers.
        text = text.replace(self.processor.boi_token, self.processor.full_image_sequence, images)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def conversation(self, turns: list[tuple[str, str]], images: int = 1) -> TokenisedConversation:
        ids = self.ids(turns, images=images)
        labels = [IGNORE_INDEX] * len(ids)
        header = len(self.model_header)
        index = 0
        while index < len(ids):
            if ids[index] == self.start_of_turn and ids[index + 1 : index + 1 + header] == self.model_header:
                index += 1 + header
                while ids[index] != self.end_of_turn:
                    labels[index] = ids[index]
                    index += 1
                labels[index] = ids[index]  # learn to stop
            index += 1
        return TokenisedConversation(ids, labels)


def served_image(film: np.ndarray, rng: np.random.Generator):
    """The PIL image the server would hand the processor for this film, 8-bit as from a PNG, or a 16-bit film
    min-max stretched as the DICOM path does (half the time)."""
    from medgemma_xray.phantoms.films import quantize
    from medgemma_xray.xray_io import Radiograph
    from medgemma_xray.xray_io.preprocess import model_input_image
    from medgemma_xray.xray_io.radiograph import to_display_uint8

    pixels = to_display_uint8(quantize(film, 16)) if rng.random() < 0.5 else quantize(film, 8)
    return model_input_image(Radiograph(pixels, "synthetic phantom"))


def film_image(labels_seed: int, rng: np.random.Generator):
    """The served image of this phantom, and its labels."""
    image, labels, _, _ = film_image_with_regions(labels_seed, rng)
    return image, labels


def film_image_with_regions(labels_seed: int, rng: np.random.Generator):
    """(served image, labels, regions, the film's (rows, cols)) of this phantom, from one drawing."""
    from medgemma_xray.phantoms.regions import phantom_with_regions

    phantom, regions = phantom_with_regions(labels_seed)
    return served_image(phantom.film, rng), phantom.labels, regions, phantom.film.shape


def film_conversations(
    labels: PhantomLabels, rng: np.random.Generator, regions: tuple = (), shape: tuple[int, int] | None = None
) -> list[list[tuple[str, str]]]:
    """The conversations about one film: every finding question once (random phrasing and order); two whole-film
    questions, the structured report first half the time; and, given the film's regions and shape, one
    localisation question (demo_model.pointing), asked as the first turn: the UI asks "Where?" as its own request."""
    from medgemma_xray.demo_model import pointing

    overview = teaching.overview_pairs(labels, rng)
    report, others = overview[0], overview[1:]
    chosen = [others[i] for i in rng.choice(len(others), size=2, replace=False)]
    if rng.random() < 0.5:
        chosen[0] = report
    conversations = [teaching.question_answer_pairs(labels, rng), chosen]
    if shape is not None:
        conversations.append(pointing.localisation_turns(labels, regions, *shape, rng, turns=1))
    return conversations


# The task of each of film_conversations' conversations, in order (per-task losses in the training log).
FILM_TASKS = ("findings", "overview", "locate")
PAIR_TASK = "compare"


def model_boxes(regions: tuple, shape: tuple[int, int]) -> dict[str, list[float]]:
    """Each region's box in the model's frame as fractions (0..1 of the padded square), keyed by finding and side
    ("pleural_effusion:right"): the auxiliary box read-out's targets."""
    from medgemma_xray.grounding.boxes import to_model

    return {f"{r.finding}:{r.side}": [v / 1000 for v in to_model(r.box, *shape)] for r in regions}


@dataclass
class PooledFilm:
    """One training film as the model sees it, and the conversations it is taught with (one list per variant)."""

    pixels: np.ndarray  # uint8 (896, 896): the processor's output mapped back to 8 bits (grey, so one channel)
    labels: PhantomLabels
    variants: list[list[TokenisedConversation]]
    boxes: dict = field(default_factory=dict)  # model_boxes of its regions


@dataclass
class PooledPair:
    """One progression pair as the model sees it: both films, and the comparison conversation (the same text for
    every variant: the prompt is fixed and the answer is the pair's key)."""

    prior: np.ndarray  # uint8 (896, 896), as PooledFilm.pixels
    current: np.ndarray
    prior_labels: PhantomLabels
    current_labels: PhantomLabels
    conversation: TokenisedConversation


_WORKER_TOKENISER: ConversationTokeniser | None = None


def _init_worker(processor) -> None:
    global _WORKER_TOKENISER
    _WORKER_TOKENISER = ConversationTokeniser(processor)


def pooled_film(seed: int, variants: int, tokeniser: ConversationTokeniser | None = None) -> PooledFilm:
    """Draw, preprocess and tokenise one film: a pure function of its seed (so the pool is the same for any
    number of workers)."""
    tokeniser = tokeniser or _WORKER_TOKENISER
    if tokeniser is None:
        raise RuntimeError(
            "pooled_film needs a tokeniser: pass one, or call it in a pool worker made with _init_worker."
        )
    rng = np.random.default_rng([seed, 7])
    image, labels, regions, film_shape = film_image_with_regions(seed, rng)
    pixels = _processed_pixels(tokeniser, image)
    conversations = [
        [tokeniser.conversation(turns) for turns in film_conversations(labels, rng, regions, film_shape)]
        for _ in range(variants)
    ]
    return PooledFilm(pixels, labels, conversations, model_boxes(regions, film_shape))


def _processed_pixels(tokeniser: ConversationTokeniser, image) -> np.ndarray:
    values = tokeniser.processor.image_processor(images=[image], return_tensors="np")["pixel_values"][0, 0]
    return np.clip(np.rint((values * 0.5 + 0.5) * 255.0), 0, 255).astype(np.uint8)  # mean 0.5, std 0.5


def pooled_pair(seed: int, tokeniser: ConversationTokeniser | None = None) -> PooledPair:
    """Draw, preprocess and tokenise one progression pair: a pure function of its seed."""
    from medgemma_xray.demo_model import pointing
    from medgemma_xray.phantoms.progression import progression_pair

    tokeniser = tokeniser or _WORKER_TOKENISER
    if tokeniser is None:
        raise RuntimeError(
            "pooled_pair needs a tokeniser: pass one, or call it in a pool worker made with _init_worker."
        )
    rng = np.random.default_rng([seed, 11])
    pair = progression_pair(seed)
    prior = _processed_pixels(tokeniser, served_image(pair.prior.film, rng))
    current = _processed_pixels(tokeniser, served_image(pair.current.film, rng))
    conversation = tokeniser.conversation([pointing.comparison_turn(pair.changes)], images=2)
    return PooledPair(prior, current, pair.prior.labels, pair.current.labels, conversation)


def _pooled_film_task(task: tuple[int, int]) -> PooledFilm:
    return pooled_film(*task)


def _pooled_pair_task(seed: int) -> PooledPair:
    return pooled_pair(seed)


class TeachingData:
    """A fixed pool of training films (seeds from TRAIN_SEED_BASE + data_seed * 1e8) and progression pairs (seeds
    PAIR_SEED_OFFSET above those), drawn and tokenised once, in parallel; an epoch visits every film once in an
    order drawn from (data_seed, epoch), and epoch e teaches film i with its variant e % variants; pairs are visited
    the same way, in their own epochs. Step s of data seed d therefore always gives the same films, pairs and
    conversations, and a GPU spends its time training rather than drawing phantoms."""

    def __init__(
        self,
        processor,
        data_seed: int,
        films_per_step: int,
        pool_films: int = 64,
        variants: int = 4,
        workers: int = 1,
        pool_pairs: int = 0,
        pairs_per_step: int = 0,
        extra_films: int = 0,
        extra_with: Sequence[str] = (),
    ) -> None:
        self.processor = processor
        self.tokeniser = ConversationTokeniser(processor)
        self.data_seed = data_seed
        self.films_per_step = films_per_step
        self.pairs_per_step = pairs_per_step if pool_pairs else 0
        self.variants = variants
        if pool_films < films_per_step:
            raise ValueError(f"pool_films ({pool_films}) must be at least films_per_step ({films_per_step})")
        if pool_pairs and pool_pairs < pairs_per_step:
            raise ValueError(f"pool_pairs ({pool_pairs}) must be at least pairs_per_step ({pairs_per_step})")
        seeds = [self.film_seed(index) for index in range(pool_films)]
        seeds += enriched_seeds(data_seed, extra_films, extra_with)
        tasks = [(seed, variants) for seed in seeds]
        pair_seeds = [self.pair_seed(index) for index in range(pool_pairs)]
        if workers > 1:
            import multiprocessing

            context = multiprocessing.get_context("fork")  # the workers inherit the processor, nothing to pickle
            with context.Pool(workers, initializer=_init_worker, initargs=(processor,)) as pool:
                films = pool.map_async(_pooled_film_task, tasks, chunksize=8)
                pairs = pool.map_async(_pooled_pair_task, pair_seeds, chunksize=8)
                self.films, self.pairs = films.get(), pairs.get()
        else:
            self.films = [pooled_film(seed, count, self.tokeniser) for seed, count in tasks]
            self.pairs = [pooled_pair(seed, self.tokeniser) for seed in pair_seeds]
        self._pixels: torch.Tensor | None = None
        self._pair_pixels: torch.Tensor | None = None
        self._pixels_device: str | None = None

    def film_seed(self, index: int) -> int:
        return TRAIN_SEED_BASE + self.data_seed * 100_000_000 + index

    def pair_seed(self, index: int) -> int:
        return TRAIN_SEED_BASE + self.data_seed * 100_000_000 + PAIR_SEED_OFFSET + index

    def pixels_on(self, device: str):
        """The whole pool's films as one uint8 tensor on `device` (896 x 896 bytes a film)."""
        self._to_device(device)
        return self._pixels

    def pair_pixels_on(self, device: str):
        """The pairs' films as one uint8 tensor (pairs, 2, 896, 896) on `device`: prior, then current."""
        self._to_device(device)
        return self._pair_pixels

    def _to_device(self, device: str) -> None:
        import torch

        # Keyed by the name asked for: a tensor's own device reads "cuda:0" when "cuda" was asked, and comparing
        # the two re-sent the whole pool every step (3 s a step on the H200 for 8000 films).
        if self._pixels is None or self._pixels_device != device:
            self._pixels = torch.from_numpy(np.stack([film.pixels for film in self.films])).to(device)
            if self.pairs:
                both = np.stack([np.stack([pair.prior, pair.current]) for pair in self.pairs])
                self._pair_pixels = torch.from_numpy(both).to(device)
            self._pixels_device = device

    def film_indices(self, step: int) -> tuple[list[int], int]:
        return _visit(len(self.films), self.films_per_step, self.data_seed, step)

    def pair_indices(self, step: int) -> list[int]:
        if not self.pairs_per_step:
            return []
        return _visit(len(self.pairs), self.pairs_per_step, self.data_seed + 7919, step)[0]

    def batch(self, step: int, device: str = "cpu") -> Batch:
        import torch

        indices, epoch = self.film_indices(step)
        pair_indices = self.pair_indices(step)
        sequences, image_index, tasks = [], [], []
        for slot, index in enumerate(indices):
            for task, conversation in zip(FILM_TASKS, self.films[index].variants[epoch % self.variants], strict=False):
                sequences.append(conversation)
                image_index.append(slot)
                tasks.append(task)
        for number, index in enumerate(pair_indices):
            sequences.append(self.pairs[index].conversation)
            image_index += [len(indices) + 2 * number, len(indices) + 2 * number + 1]  # prior, then current
            tasks.append(PAIR_TASK)
        grey = self.pixels_on(device)[torch.tensor(indices, device=device)]
        if pair_indices:
            pair_grey = self.pair_pixels_on(device)[torch.tensor(pair_indices, device=device)].flatten(0, 1)
            grey = torch.cat([grey, pair_grey])
        grey = grey.float() / 255.0
        pixel_values = ((grey - 0.5) / 0.5).unsqueeze(1).expand(-1, 3, -1, -1)
        batch = collate(self.processor, pixel_values, sequences, image_index, self.tokeniser.image_token_id)
        batch.film_labels = [self.films[index].labels for index in indices]
        batch.film_boxes = [self.films[index].boxes for index in indices]
        for index in pair_indices:
            batch.film_labels += [self.pairs[index].prior_labels, self.pairs[index].current_labels]
            batch.film_boxes += [{}, {}]  # no box targets: their films teach the comparison
        batch.tasks = tasks
        return batch


PAIR_SEED_OFFSET = 50_000_000  # pair seeds lie this far above a data seed's film seeds (pools stay far below it)
EXTRA_SEED_OFFSET = 20_000_000  # the seeds enriched_seeds scans start this far above a data seed's film seeds


def enriched_seeds(data_seed: int, count: int, findings: Sequence[str]) -> list[int]:
    """`count` more training-film seeds whose drawn labels hold at least one of `findings`: the first such seeds
    from TRAIN_SEED_BASE + data_seed * 1e8 + EXTRA_SEED_OFFSET up. A pool tilted towards the findings a checkpoint
    still gets wrong (small nodules, and pacemakers that a reader must not call a nodule), drawn from labels alone
    (cheap), so the films stay a pure function of their seeds."""
    if count and not findings:
        raise ValueError("extra films need at least one finding to select them by (--extra_with)")
    unknown = [finding for finding in findings if finding not in FINDINGS]
    if unknown:
        raise ValueError(f"unknown finding(s) {', '.join(unknown)}; choose from {', '.join(FINDINGS)}")
    seeds: list[int] = []
    candidate = TRAIN_SEED_BASE + data_seed * 100_000_000 + EXTRA_SEED_OFFSET
    while len(seeds) < count:
        labels = sample_labels(candidate)
        if any(labels.present(finding) for finding in findings):
            seeds.append(candidate)
        candidate += 1
    return seeds


def _visit(count: int, per_step: int, order_seed: int, step: int) -> tuple[list[int], int]:
    """The pool indices step `step` visits, and its epoch: every item once an epoch, in an order drawn per epoch."""
    per_epoch = count // per_step
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([order_seed, epoch]).permutation(count)
    start = position * per_step
    return [int(i) for i in order[start : start + per_step]], epoch


def collate(processor, images, sequences: list[TokenisedConversation], image_index: list[int], image_token_id: int):
    import torch

    pad_id = processor.tokenizer.pad_token_id
    length = max(len(s.input_ids) for s in sequences)
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    labels = torch.full((len(sequences), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence.input_ids)] = torch.tensor(sequence.input_ids)
        labels[row, : len(sequence.labels)] = torch.tensor(sequence.labels)
        attention_mask[row, : len(sequence.input_ids)] = 1
    pixel_values = (
        images
        if hasattr(images, "shape")
        else processor.image_processor(images=images, return_tensors="pt")["pixel_values"]
    )
    return Batch(
        pixel_values=pixel_values,
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=(input_ids == image_token_id).long(),
        labels=labels,
        image_index=torch.tensor(image_index, dtype=torch.long),
        answer_tokens=int((labels != IGNORE_INDEX).sum()),
    )


def tokenizer_corpus(count: int = 1500, pointing_texts: bool = True) -> list[str]:
    """Every kind of text the model reads or writes, from `count` sampled label sets (the BPE's training text):
    with pointing_texts, also the localisation and comparison prompts and answers (box coordinates drawn at random:
    digits are single tokens, so their values do not shape the merges)."""
    from medgemma_xray.assistant.report_schema import REPORT_PROMPT
    from medgemma_xray.demo_model.corpus import RADIOLOGY_CORPUS

    lines = [SYSTEM_PROMPT, REPORT_PROMPT, *RADIOLOGY_CORPUS.splitlines()]
    for questions in FINDING_QUESTIONS.values():
        lines.extend(questions)
    rng = np.random.default_rng(0)
    for seed in range(count):
        labels = sample_labels(TRAIN_SEED_BASE + seed)
        for question, answer in teaching.question_answer_pairs(labels, rng) + teaching.overview_pairs(labels, rng):
            lines.extend([question, *answer.splitlines()])
    if pointing_texts:
        from medgemma_xray.demo_model import pointing

        pointing_rng = np.random.default_rng(1)
        for seed in range(count):
            lines.extend(pointing.corpus_lines(TRAIN_SEED_BASE + seed, pointing_rng))
    return lines
