"""What both pages add to Gradio's default theme and markup, so that axe-core finds no critical or serious rule.

- Text at >= 4.5:1: Ask, Reveal and Stop (the theme's orange gives 2.8:1 and its red 3.8:1), and the theme's
  "subdued" grey (#bbbbc2 on white, 1.9:1) used by the upload box's "- or -", the page links, a dropdown's
  placeholder and a slider's limits.
- No download link on an upload's chip (the upload is deleted once read: the link could only answer 403).
- The model badge never becomes a scroll box (one that holds nothing focusable cannot be scrolled by keyboard).
- Gradio marks an empty image box as <div aria-label="Empty value">, an aria-label on an element without a role
  (axe's aria-prohibited-attr): ACCESSIBILITY_JS gives each such box role="img" (an empty image, named). It names
  an upload box by what it shows ("Drop File Here - or - Click to Upload"), not by an aria-label that differs
  from its visible text (axe's label-content-name-mismatch, WCAG 2.5.3). Both now and whenever Gradio draws them
  again.
Each page puts PAGE_STYLE in a gr.HTML (a route of a multi-page app gets no stylesheet of the main page's) and runs
ACCESSIBILITY_JS when it loads.
"""

PAGE_CSS = """
:root, .dark { --body-text-color-subdued: #4b5563; }
#ask, #ask:hover, #teach-ask, #teach-ask:hover, #teach-reveal, #teach-reveal:hover
  { background: #9a3412; border-color: #9a3412; color: #ffffff; }
#stop, #stop:hover, #teach-stop, #teach-stop:hover { background: #b91c1c; border-color: #b91c1c; color: #ffffff; }
#case-tabs button[role="tab"][aria-selected="true"] { color: #9a3412; }
footer .show-api, footer .built-with, footer .settings { color: #4b5563; }
a[data-sveltekit-reload] { color: #374151 !important; }  /* the page links (main, /teaching) Gradio draws on top */
.upload-container .or { color: #4b5563; }
#film-upload td.download, #teach-upload td.download, #teach-key td.download { display: none; }
.answer-details summary { cursor: pointer; }
#model-badge { overflow: visible !important; }  /* a scroll box with nothing to focus (scrollable-region-focusable) */
"""
PAGE_STYLE = f"<style>{PAGE_CSS}</style>"
ACCESSIBILITY_JS = """
() => {
  if (window.__namedEmptyImages) return;
  window.__namedEmptyImages = true;
  const name = () => {
    document.querySelectorAll('div.empty[aria-label]:not([role])').forEach((box) => box.setAttribute('role', 'img'));
    document.querySelectorAll('button.upload-container[aria-label]').forEach((box) => box.removeAttribute('aria-label'));
  };
  name();
  new MutationObserver(name).observe(document.body, {subtree: true, childList: true, attributes: true,
    attributeFilter: ['aria-label']});
}
"""
