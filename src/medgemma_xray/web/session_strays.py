"""Dropping the component copies that Gradio strands in a session's state, one per update, for the session's life.

When a handler returns gr.update(...) for an output, Gradio stores a new component in the session's state under
the output's id; that copy gets a fresh id of its own. When a later event returns a plain value for the same
output, Gradio's postprocess_data takes the copy from the state and, finding the copy's own id missing, files it
again under that id, with a whole config dict beside it. Nothing reads that entry again, and each update makes a
new copy with a new id: a session that asks a question (the ask button's update, then the question box's value)
kept one more Textbox and its config per question. In the one-hour soak's load, 55 copies a minute, one of the
two Python-side causes of its RSS creep (benchmarks/rss_attribution.py found them: gradio Textbox objects, held by
a session's BlocksConfig under ids above any of the page's own).

This app renders no components at run time (no gr.render), so every id in a session's state that the page does
not have is such a stray: after each postprocess_data, those entries go.
"""

from __future__ import annotations

import types


def drop_stray_components(demo) -> None:
    """Wrap demo.postprocess_data (this Blocks only) so that each event's session state keeps the page's own ids."""
    own = frozenset(demo.default_config.blocks)
    original = demo.postprocess_data

    async def postprocess_data(self, block_fn, predictions, state):
        try:
            return await original(block_fn, predictions, state)
        finally:
            if state is not None:
                drop_strays(state, own)

    demo.postprocess_data = types.MethodType(postprocess_data, demo)


def drop_strays(state, own: frozenset[int]) -> int:
    """Remove the entries of a gradio SessionState whose id is not one of the page's own; how many went."""
    blocks = state.blocks_config.blocks
    stray = [key for key in blocks if key not in own]
    stray += [key for key in state.config_values if key not in own and key not in blocks]
    for key in stray:
        blocks.pop(key, None)
        state.config_values.pop(key, None)
    return len(stray)
