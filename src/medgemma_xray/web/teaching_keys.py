"""/teaching's viewer habits in the browser (OHIF's): a key for every tool with a help overlay, window/level by
dragging the film with the right or middle button (live values, a live preview, then the server's render), and
the projector layout (film and chat only). Scripts and styles only; the page's layout and handlers are elsewhere.

The drag previews the new window exactly on the picture already shown (an SVG linear transfer: the shown grey g
becomes g * w0/w + (c0 - c + (w - w0)/2)/w), writes the live level and width into their boxes, and on release
asks the server for the real render (the hidden Apply button, web.teaching_view.set_window).
"""

from __future__ import annotations

import json

# key -> (what it does, the CSS selector of the control the key clicks)
KEYS: dict[str, tuple[str, str]] = {
    "1": ("Lung window", "#teach-lung"),
    "2": ("Mediastinum window", "#teach-mediastinum"),
    "3": ("Bone window", "#teach-bone"),
    "0": ("The file's own window", "#teach-file-window"),
    "i": ("Invert", "#teach-invert"),
    "+": ("Zoom in", "#teach-zoom-in"),
    "=": ("Zoom in", "#teach-zoom-in"),
    "-": ("Zoom out", "#teach-zoom-out"),
    "r": ("Reset the view", "#teach-reset"),
    "l": ("Ruler (length)", "#teach-tool input[value='ruler']"),
    "c": ("CTR calliper", "#teach-tool input[value='ctr']"),
    "m": ("Pan (move)", "#teach-tool input[value='pan']"),
    "v": ("Pixel probe (value)", "#teach-tool input[value='probe']"),
    "k": ("Mark a finding (point or box)", "#teach-tool input[value='mark']"),
    "p": ("Projector layout: film and chat only", "#teach-projector"),
    "?": ("This list of keys", "#teach-keys"),
    "h": ("This list of keys", "#teach-keys"),
}
MOUSE = (
    ("Left click", "the current tool: ruler, calliper, pan, probe or mark"),
    ("Right or middle drag", "window and level: left-right the width, up-down the level"),
    ("Level, Width + Enter", "apply a typed window"),
    ("Esc", "close this list"),
)


def help_html() -> str:
    """The overlay listing every key (hidden until ? or H)."""
    seen: dict[str, list[str]] = {}
    for key, (action, _) in KEYS.items():
        seen.setdefault(action, []).append(key.upper() if key.isalpha() else key)
    rows = "".join(f"<tr><td><kbd>{' / '.join(keys)}</kbd></td><td>{action}</td></tr>" for action, keys in seen.items())
    rows += "".join(f"<tr><td>{what}</td><td>{does}</td></tr>" for what, does in MOUSE)
    return (
        '<div id="teach-help-box" role="dialog" aria-label="Viewer keys"><h2>Viewer keys</h2>'
        f"<table>{rows}</table><p>Press Esc or ? to close.</p></div>"
    )


TEACH_CSS = """
.teach-hidden { display: none !important; }
#teach-tools { min-width: 170px !important; }
#teach-tools button { min-width: 0; }
#teach-view { position: relative; }
#teach-wl-live { position: absolute; top: 6px; left: 6px; z-index: 5; background: rgba(0,0,0,.75); color: #fff;
  font: 600 14px/1.3 monospace; padding: 3px 6px; border-radius: 4px; pointer-events: none; display: none; }
#teach-help { position: fixed; inset: 0; z-index: 1000; background: rgba(0,0,0,.55); display: none;
  align-items: center; justify-content: center; }
body.teach-help-open #teach-help { display: flex; }
#teach-help-box { background: #fff; color: #111; padding: 16px 22px; border-radius: 8px; max-height: 90vh;
  overflow: auto; font-size: 15px; }
#teach-help-box td { padding: 2px 14px 2px 0; }
#teach-help-box kbd { font: 600 14px monospace; border: 1px solid #777; border-radius: 3px; padding: 0 4px; }
body.projector #teach-header, body.projector #teach-top, body.projector .teach-engineering,
body.projector #teach-case-info, body.projector #teach-tools, body.projector .teach-form,
body.projector #teach-reveal, body.projector .teach-after, body.projector footer,
body.projector #teach-model-view { display: none !important; }
body.projector #teach-main-row { position: fixed; inset: 0; z-index: 900; margin: 0; padding: 6px; gap: 8px;
  background: var(--body-background-fill, #fff); overflow: hidden; }
body.projector #teach-view-col { flex-grow: 3 !important; min-width: 60% !important; }
body.projector #teach-view img { max-height: calc(100vh - 52px) !important; height: calc(100vh - 52px) !important;
  width: 100% !important; object-fit: contain !important; }
body.projector #teach-view .image-container, body.projector #teach-view .image-frame { height: auto !important; }
body.projector #teach-chat { height: calc(100vh - 190px) !important; font-size: 1.35em; }
"""

KEYS_JS = """
() => {
  if (window.__teachKeys) return;
  window.__teachKeys = true;
  const keys = %(keys)s;
  const typing = (t) => t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.tagName === 'SELECT' || t.isContentEditable);
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') { document.body.classList.remove('teach-help-open'); return; }
    if (typing(e.target) || e.ctrlKey || e.metaKey || e.altKey) return;
    if (!document.getElementById('teach-view')) return;  // another page
    const selector = keys[e.key.toLowerCase()];
    const control = selector && document.querySelector(selector);
    if (control) { e.preventDefault(); control.click(); }
  });
  // Window/level by dragging the film with the right or middle button.
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('width', '0'); svg.setAttribute('height', '0'); svg.style.position = 'absolute';
  svg.innerHTML = '<filter id="teach-wl-filter" color-interpolation-filters="sRGB"><feComponentTransfer>'
    + ['R', 'G', 'B'].map((c) => `<feFunc${c} type="linear" slope="1" intercept="0"/>`).join('')
    + '</feComponentTransfer></filter>';
  document.body.appendChild(svg);
  const box = (id) => document.querySelector(`#${id} input`);
  const live = () => {
    let label = document.getElementById('teach-wl-live');
    const view = document.getElementById('teach-view');
    if (!label && view) { label = document.createElement('div'); label.id = 'teach-wl-live'; view.appendChild(label); }
    return label;
  };
  const setBox = (input, value) => { input.value = String(value); input.dispatchEvent(new Event('input', {bubbles: true})); };
  let drag = null;
  document.addEventListener('contextmenu', (e) => { if (e.target.closest && e.target.closest('#teach-view')) e.preventDefault(); });
  document.addEventListener('mousedown', (e) => {
    const img = e.target.closest && e.target.closest('#teach-view img');
    if (!img || (e.button !== 1 && e.button !== 2)) return;
    const c = parseFloat(box('teach-level').value), w = parseFloat(box('teach-width').value);
    if (!isFinite(c) || !isFinite(w)) return;
    e.preventDefault();
    drag = {x: e.clientX, y: e.clientY, c0: c, w0: w, c, w, img, rect: img.getBoundingClientRect()};
    img.style.filter = 'url(#teach-wl-filter)';
  });
  document.addEventListener('mousemove', (e) => {
    if (!drag) return;
    const dx = (e.clientX - drag.x) / drag.rect.width, dy = (e.clientY - drag.y) / drag.rect.height;
    drag.w = Math.max(1, drag.w0 * (1 + 2 * dx));
    drag.c = drag.c0 + dy * drag.w0;
    const slope = drag.w0 / drag.w, intercept = (drag.c0 - drag.c + (drag.w - drag.w0) / 2) / drag.w;
    svg.querySelectorAll('feFuncR, feFuncG, feFuncB').forEach((f) => {
      f.setAttribute('slope', String(slope)); f.setAttribute('intercept', String(intercept)); });
    const label = live();
    if (label) { label.style.display = 'block'; label.textContent = `W ${drag.w.toFixed(1)}  L ${drag.c.toFixed(1)}`; }
    setBox(box('teach-level'), drag.c.toFixed(2)); setBox(box('teach-width'), drag.w.toFixed(2));
  });
  document.addEventListener('mouseup', () => {
    if (!drag) return;
    const done = drag; drag = null;
    const label = live();
    const old = done.img.getAttribute('src');
    if (done.c === done.c0 && done.w === done.w0) { done.img.style.filter = ''; if (label) label.style.display = 'none'; return; }
    setBox(box('teach-level'), done.c.toFixed(2)); setBox(box('teach-width'), done.w.toFixed(2));
    setTimeout(() => document.getElementById('teach-apply-window').click(), 0);
    const started = Date.now();
    const settle = setInterval(() => {
      const now = document.querySelector('#teach-view img');
      if ((now && now.getAttribute('src') !== old && now.complete) || Date.now() - started > 15000) {
        done.img.style.filter = ''; if (now) now.style.filter = '';
        if (label) label.style.display = 'none';
        clearInterval(settle);
      }
    }, 50);
  });
}
"""


def keys_js() -> str:
    return KEYS_JS % {"keys": json.dumps({key: selector for key, (_, selector) in KEYS.items()})}


TEACH_STYLE = f"<style>{TEACH_CSS}</style>"
PROJECTOR_JS = "() => { document.body.classList.toggle('projector'); window.scrollTo(0, 0); }"
HELP_JS = "() => { document.body.classList.toggle('teach-help-open'); }"
