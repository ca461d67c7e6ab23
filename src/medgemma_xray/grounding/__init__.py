"""Grounding: findings located as boxes on a film, in MedGemma 1.5's published box format, and the prompts that ask
for them (one finding's box, and what changed since a prior film).

Pure logic on numbers and text (no model, no image library), so every layer can use it: the phantoms (their
ground-truth regions), the demo model's training texts, the evaluation (IoU), the teaching page (drawing and
scoring). Coordinates cross one border only: the model's frame (the film zero-padded to a centred square,
normalised to 0..1000, [y0, x0, y1, x1]) and the film's frame (fractions of the film's own rows and columns).
"""
