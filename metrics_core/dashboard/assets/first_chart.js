// The run page's first chart, drawn by the page's own HTML before Streamlit has laid out the page
// (chart.first_chart_tags; issue 11: in a fresh browser the picture is ready ~0.2-0.4 s before
// Streamlit's page has made the live chart's place, and ~0.6 s before the live chart has drawn).
// As the HTML is parsed, ahead of Streamlit's scripts, it runs plotly.js (window.__metricsRunPlotly,
// chart.plotly_head_tags: it then runs while the browser still waits for Streamlit's ~60 scripts)
// and asks the server's first-chart route for the figure the live chart will draw first (the run
// page's controls as they start, in the page's theme).  The figure is drawn as soon as both are
// there, at the place and width the live chart will have: the run page puts a fixed number of
// one-line rows above its charts (pages/run.py), so that place follows from the viewport's width
// (guessPlace).  It is shown there at once, on a page Streamlit has not laid out yet, and stays
// put while Streamlit's page forms around it (its elements pass through other places on the way).
// Where that place cannot be known (the server sets theme font sizes, the page is embedded, the
// reader has resized the sidebar) it is shown instead once Streamlit has made the live chart's
// element, on top of it, drawn again first if its width was guessed wrong, and follows that
// element as the page settles.  Either way it follows the element when the reader scrolls or
// resizes, lets clicks through (no hover, no zoom), and is removed when the live chart has drawn
// in that element (or something there says it could not), when the page's first script run ends
// without that element (an unreadable run, a run picker), or at the latest LIVE_CHART_WAIT_MS
// after that run.
(() => {
  // Once the page's first script run has ended, the live chart has this long to draw before the
  // picture goes anyway (Streamlit failed to mount it, the server went away): a stale picture that
  // looks live must not stay.
  const LIVE_CHART_WAIT_MS = 5000;
  const SIDEBAR_WIDTH = 300; // Streamlit's, unless the reader drags it wider
  // {route: relative to the server's base URL, theme: the one the server imposes (theme.base) or
  // null, place: whether the live chart's place follows from the viewport}, written in by
  // chart.first_chart_tags.
  const config = __FIRST_CHART__;
  const base = window.__streamlit && window.__streamlit.BACKEND_BASE_URL;
  const query = new URLSearchParams(location.search);
  const run = query.getAll("run").pop(); // the last, as Streamlit's st.query_params reads it
  if (!base || !run || !window.__metricsRunPlotly) return;
  const page = location.href;
  const url = new URL(config.route, base);
  url.search = new URLSearchParams({ run, theme: theme() });
  window.__metricsRunPlotly();
  fetch(url, { cache: "no-store" })
    .then((answer) => (answer.status === 200 ? answer.json() : null))
    .then((first) => first && window.__metricsPlotly.then((Plotly) => follow(Plotly, first)))
    .catch((error) => console.warn("metrics_core: no early first chart", error));

  // The theme Streamlit's page takes, in its order: the page's embed options, the reader's choice in
  // its settings menu (kept per page path), the server's theme.base, the system's.
  function theme() {
    const embed = query.getAll("embed_options");
    if (embed.includes("light_theme")) return "light";
    if (embed.includes("dark_theme")) return "dark";
    let chosen = null;
    try {
      chosen = JSON.parse(localStorage.getItem(`stActiveTheme-${location.pathname}-v2`));
    } catch (error) {
      // no storage (a sandboxed frame) or not JSON: as if nothing was chosen
    }
    if (chosen === "Dark" || chosen === "Light") return chosen.toLowerCase();
    if (config.theme) return config.theme;
    return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  // Whether guessPlace holds: the server's layout is the one measured, the page is not embedded
  // (no top bar, other padding) and the reader has not resized the sidebar (Streamlit keeps its
  // width in localStorage).
  function placeKnown() {
    let sidebar = null;
    try {
      sidebar = localStorage.getItem("sidebarWidth");
    } catch (error) {
      return false; // no storage: the sidebar's width cannot be read
    }
    return config.place && !query.has("embed") && (sidebar === null || sidebar === String(SIDEBAR_WIDTH));
  }

  // The live chart's place as Streamlit's wide layout makes it, before that layout exists (measured
  // with Streamlit 1.67 at widths from 320 to 2,560 px): a sidebar 300 px wide beyond 768 px of
  // viewport, the main block's padding (80 px from 864 px, else 16; 8rem at the top from 768 px,
  // else 6rem), two columns 16 px apart beyond 640 px, and above the first one the run page's rows:
  // title, page links (stacked, one more row, up to 640 px), status, health and config, session key.
  function guessPlace() {
    const viewport = document.documentElement.clientWidth;
    const sidebar = viewport > 768 ? SIDEBAR_WIDTH : 0;
    const padding = viewport >= 864 ? 80 : 16;
    const columns = viewport > 640;
    const main = viewport - sidebar - 2 * padding;
    return {
      left: sidebar + padding,
      top: (viewport >= 768 ? 128 : 96) + 257.390625 + (columns ? 0 : 52),
      width: columns ? (main - 16) / 2 : main,
    };
  }

  function follow(Plotly, { key, figure }) {
    const slot = `.st-key-${CSS.escape(key)}`;
    // Drawn, or failed: chart.js says why, or Streamlit could not mount the component (an alert).
    const drawn = [".js-plotly-plot .main-svg", ".metrics-chart-note", "[data-testid=stAlertContainer]"]
      .map((inside) => `${slot} ${inside}`).join(", ");
    const finished = "[data-testid=stApp][data-test-script-state=notRunning]";
    let box = null;
    let drawing = null; // the picture's first draw (a promise); hidden until it is in place
    let drawnWidth = 0; // its width in CSS pixels, as last laid out
    let shown = false;
    let frame = null;
    let ended = false;
    let expired = false; // the first script run ended LIVE_CHART_WAIT_MS ago and still no live chart
    let waiting = false;
    // shown at the guessed place before Streamlit made the live chart's element: it stays there while
    // the page forms, until the reader scrolls or resizes
    let pinned = false;
    const update = () => {
      if (ended) return;
      const target = document.querySelector(slot);
      const over = document.querySelector(finished);
      if (over && !waiting) {
        waiting = true;
        setTimeout(() => {
          expired = true;
          update();
        }, LIVE_CHART_WAIT_MS);
      }
      if (location.href !== page || expired || document.querySelector(drawn) || (!target && over)) {
        ended = true;
        observer.disconnect();
        removeEventListener("scroll", moved, true);
        removeEventListener("resize", moved);
        if (box) {
          Plotly.purge(box);
          box.remove();
        }
      } else if (target && !pinned) {
        const { left, top, width } = target.getBoundingClientRect();
        if (box === null) draw(width);
        const resized = Math.abs(width - drawnWidth) >= 0.5;
        drawnWidth = width;
        Object.assign(box.style, { left: `${left}px`, top: `${top}px`, width: `${width}px` });
        if (!shown) {
          shown = true;
          // at once, in this task, when the guess was right; a wrong one is drawn again first
          drawing
            .then(() => resized && Plotly.relayout(box, { autosize: true }))
            .then(() => box.style.removeProperty("visibility"));
        } else if (resized) Plotly.Plots.resize(box);
      }
    };
    const draw = (width) => {
      box = document.createElement("div");
      box.className = "metrics-first-chart";
      // fixed, in the viewport's coordinates: an absolute box below the fold would make the document
      // itself scroll, and its scrollbar shift the page twice
      box.style.cssText = `position: fixed; z-index: 999990; pointer-events: none; visibility: hidden;
        left: 0; top: 0; width: ${width}px;`;
      drawnWidth = width;
      document.body.appendChild(box);
      drawing = Plotly.newPlot(box, figure.data, figure.layout, { staticPlot: true });
    };
    // Streamlit changes the page many times a frame while it renders: follow it once per frame, but
    // show the picture in the task that made the live chart's element, so that both appear in the
    // same frame.
    const later = () => {
      if (frame !== null) return;
      frame = requestAnimationFrame(() => {
        frame = null;
        update();
      });
    };
    const moved = () => {
      pinned = false;
      later();
    };
    const observer = new MutationObserver(() => (!shown && document.querySelector(slot) ? update() : later()));
    observer.observe(document.documentElement, { subtree: true, childList: true, attributes: true,
      attributeFilter: ["data-test-script-state"] });
    addEventListener("scroll", moved, true); // Streamlit's main block scrolls, not the document
    addEventListener("resize", moved);
    const place = guessPlace();
    if (placeKnown()) {
      draw(place.width);
      pinned = shown = true;
      Object.assign(box.style, { left: `${place.left}px`, top: `${place.top}px` });
      drawing.then(() => box.style.removeProperty("visibility"));
    } else if (!document.querySelector(slot)) draw(place.width); // while Streamlit's page is still starting
    update();
  }
})();
