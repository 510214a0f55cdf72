// Draws a plotly figure into the page DOM and redraws it in place with Plotly.react, so that a
// live update keeps the user's zoom and pan (layout.uirevision stays the same across updates).
// A payload is {op: "full", seq, figure} or {op: "extend", seq, base, steps[, layout]}: an extend
// appends only the new points (Plotly.extendTraces) to the figure drawn at `base`, and redraws
// with the new layout on the data already drawn when one is sent; each seq is applied
// once, and a chart that does not hold `base` (it missed an update, or was remounted) asks Python
// again, saying which seq it holds.  Charts are drawn one per task, in page order, and a chart out of
// view is drawn only once it comes into view (inTurn, outOfView below).
// {op: "same", seq} says nothing changed since `seq` (an idle refresh: a few bytes).  A seq names a
// figure across the server (live_chart.py's Encoded.token): payloads come from reruns and, on a
// live run page, from the server's route without a rerun (window.__metricsLive, live_watch.js).
// This runtime is the "metrics_plotly_loader" component, whose element is sent once per browser
// session with the URL of plotly.js (data.src); each chart element only carries a stub calling
// window.__metricsChart, since every element carries its component's JS on every rerun.

// plotly.js, once per page, as the promise window.__metricsPlotly (of window.Plotly).
// Served by app.py, every page's <head> defines window.__metricsRunPlotly (serving.plotly_head_tags),
// which runs it as a plain <script src> of the content-hashed file, answered immutable, so the
// browser also keeps its compiled code; a chart page's head has already called it.
// Otherwise (plain Streamlit serving, or that script failed) it starts here.  Streamlit alone serves
// component assets with "Cache-Control: public" and no max-age, ETag or Last-Modified, so a
// <script src> would fetch the whole file on every page load; fetch(..., {cache: "force-cache"})
// takes a stored copy however old it is (right, as the name carries the content hash) and the script
// runs from a blob URL.  src null: plotly.js came inline with this runtime (no asset route here).
function runScript(url) {
  return new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = url;
    script.onload = () => resolve(window.Plotly);
    script.onerror = () => reject(new Error(`${url}: not run`));
    document.head.appendChild(script);
  });
}

function fromCache(src) {
  return fetch(src, { cache: "force-cache" })
    .then((answer) => (answer.ok ? answer.blob() : Promise.reject(new Error(`${src}: ${answer.status}`))))
    .then((blob) => {
      const url = URL.createObjectURL(new Blob([blob], { type: "text/javascript" }));
      return runScript(url).finally(() => URL.revokeObjectURL(url));
    })
    .catch((error) => {
      console.warn("metrics_core: plotly.js from the cache failed, loading it plainly", error);
      return runScript(src);
    });
}

function loadPlotly(src) {
  if (window.Plotly) window.__metricsPlotly = Promise.resolve(window.Plotly);
  else if (window.__metricsRunPlotly) window.__metricsRunPlotly(); // no-op if the page's head ran it
  const started = window.__metricsPlotly || Promise.reject(new Error("not started by the page"));
  window.__metricsPlotly = started.catch(() => (src ? fromCache(src) : Promise.reject(new Error("no plotly.js"))));
}

// plotly.py sends numeric arrays base64-packed ({dtype, bdata}); unpack them into typed arrays
// so that graph.data holds real arrays (readable by anyone inspecting the page), not the packing.
const TYPED = {
  i1: Int8Array, u1: Uint8Array, i2: Int16Array, u2: Uint16Array,
  i4: Int32Array, u4: Uint32Array, f4: Float32Array, f8: Float64Array,
};

function unpack(value) {
  if (Array.isArray(value)) return value.map(unpack);
  if (value === null || typeof value !== "object") return value;
  if (typeof value.bdata === "string" && TYPED[value.dtype]) {
    const bytes = Uint8Array.from(atob(value.bdata), (c) => c.charCodeAt(0));
    return new TYPED[value.dtype](bytes.buffer);
  }
  const out = {};
  for (const [key, item] of Object.entries(value)) out[key] = unpack(item);
  return out;
}

// plotly.py packs arrays in their narrowest type (steps 10..100 arrive as an Int8Array), and
// extendTraces keeps the drawn array's type: an integer array is widened to float64 before new
// points are appended, so step 1010 never wraps around to -14.
function widen(trace, name) {
  const target = trace[name];
  if (ArrayBuffer.isView(target) && !(target instanceof Float64Array || target instanceof Float32Array)) {
    trace[name] = Float64Array.from(target);
  }
  return trace[name];
}

// New points in the drawn array's own type: a typed array stays typed (null -> NaN).
function like(target, values) {
  if (target && ArrayBuffer.isView(target)) return target.constructor.from(values, (v) => (v === null ? NaN : v));
  return values;
}

function extend(Plotly, graph, steps) {
  for (const step of steps) {
    const update = {};
    for (const [name, tails] of Object.entries(step.update)) {
      update[name] = tails.map((tail, i) => like(widen(graph.data[step.indices[i]], name), tail));
    }
    Plotly.extendTraces(graph, update, step.indices);
  }
}

// The same points appended to graph.data without drawing them, for a chart out of view.
function extendData(graph, steps) {
  for (const step of steps) {
    for (const [name, tails] of Object.entries(step.update)) {
      step.indices.forEach((index, i) => {
        const trace = graph.data[index];
        const target = widen(trace, name);
        const tail = like(target, tails[i]);
        if (!ArrayBuffer.isView(target)) trace[name] = (target || []).concat(tail);
        else {
          const joined = new target.constructor(target.length + tail.length);
          joined.set(target);
          joined.set(tail, target.length);
          trace[name] = joined;
        }
      });
    }
  }
}

// Charts out of view are not redrawn per update: an append to a long run costs the page a redraw
// of every point a chart holds, and most of a page's charts are below the fold.  Such a chart
// takes the new points into graph.data (so it still holds what it says it holds, and answers
// what it shows when read) and is drawn once when it comes into view (plotly then recomputes from
// graph.data: Plotly.react sees new arrays).  Without IntersectionObserver every chart is in view.
const outOfView = new WeakSet();
let viewWatch = null;

function watchView(graph) {
  if (!("IntersectionObserver" in window)) return;
  viewWatch = viewWatch || new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (entry.isIntersecting) {
        outOfView.delete(entry.target);
        if (entry.target.__metricsStale) redrawStale(entry.target);
      } else outOfView.add(entry.target);
    }
  });
  viewWatch.observe(graph);
}

function redrawStale(graph) {
  graph.__metricsDrawn = (graph.__metricsDrawn || Promise.resolve()).then(() => window.__metricsPlotly).then((Plotly) => {
    const stale = graph.__metricsStale;
    if (!stale || graph.dataset.failed) return;
    delete graph.__metricsStale;
    return Plotly.react(graph, graph.data, withUserY(graph, stale.layout) || graph.layout, CONFIG);
  }).catch((error) => failed(graph.__metricsParent, graph, "extend", graph.dataset.wanted, error));
}

// The x-range of a relayout event in data units (a date axis reports strings: epoch ms here),
// null when the user zoomed back out, undefined when the event did not touch the x-axis.
function xrangeOf(event) {
  if (event["xaxis.autorange"] === true) return null;
  const range = event["xaxis.range"] || ("xaxis.range[0]" in event ? [event["xaxis.range[0]"], event["xaxis.range[1]"]] : undefined);
  if (!range) return undefined;
  return range.map((v) => (typeof v === "number" ? v : Date.parse(String(v).replace(" ", "T") + "Z")));
}

// The toolbar keeps what reading a chart needs (zoom, pan, autoscale to every point, reset to the
// default range, a PNG): five buttons fit in the chart's top margin beside its title on a phone, so
// they never cover the plot (plotly's full set is wider than a phone's chart).  No "Share chart":
// plotly.js offers by default to upload the chart's data to Plotly Cloud, another host.
const CONFIG = {
  responsive: true,
  displaylogo: false,
  showSendToCloud: false,
  modeBarButtonsToRemove: ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d"],
  // A double-click shows every point (a spike the default y-range leaves out included), as the
  // autoscale button does; the reset button still goes back to the default range.
  doubleClick: "autosize",
};

// A chart whose user asked for every point (autoscale, a double-click) keeps showing every point
// when a live update brings a new default y-range: Plotly.react would take the new range, since
// uirevision keeps a user's choice only while the figure's own value stays the same.  A zoom or a
// reset hands the y-axis back to the figure.
function withUserY(graph, layout) {
  if (!graph.__metricsYAll || !layout || !layout.yaxis || !layout.yaxis.range) return layout;
  const yaxis = { ...layout.yaxis, autorange: true };
  delete yaxis.range;
  return { ...layout, yaxis };
}

function noteUserY(graph, event) {
  if (event["yaxis.autorange"] === true) graph.__metricsYAll = true;
  else if ("yaxis.range" in event || "yaxis.range[0]" in event) graph.__metricsYAll = false;
}

// The charts on the page by element key, for the route's payloads (live_watch.js, live_feed.py).
const charts = new Map();

function drawChart(component) {
  const { data, parentElement, setTriggerValue, setStateValue } = component;
  let graph = parentElement.querySelector(".metrics-chart");
  if (!graph) {
    graph = document.createElement("div");
    graph.className = "metrics-chart";
    graph.style.width = "100%";
    parentElement.appendChild(graph);
  }
  // The latest component instance's: for a failed draw, a missed base and a zoom to call.
  graph.__metricsTrigger = setTriggerValue;
  graph.__metricsSetState = setStateValue;
  graph.__metricsParent = parentElement;
  if (!graph.__metricsWatched) {
    graph.__metricsWatched = true;
    watchView(graph);
  }
  if (data.key) charts.set(data.key, { parentElement, graph });
  csvLink(parentElement, data.csv);
  apply(parentElement, graph, data);
}

// What each chart holds (element key -> figure token) and whether every chart can take the route's
// payloads: none zoomed to raw points (its figure is the zoom's, drawn by a rerun), failed or still
// without a figure.  Charts no longer on the page are forgotten.
function held() {
  const holding = {};
  let complete = true;
  for (const [key, { graph }] of [...charts].sort(([a], [b]) => (a < b ? -1 : 1))) { // one order: answers are shared
    if (!graph.isConnected) {
      charts.delete(key);
      if (viewWatch) viewWatch.unobserve(graph);
      continue;
    }
    const zoomed = graph.dataset.zoom && graph.dataset.zoom !== "null";
    if (graph.dataset.wanted && !graph.dataset.failed) holding[key] = Number(graph.dataset.wanted);
    if (zoomed || !graph.dataset.wanted || graph.dataset.failed) complete = false;
  }
  return { held: holding, complete };
}

// The route's payloads (element key -> payload), applied in the order a reader looks at the page:
// the charts in view first, top to bottom, left to right; then those out of view.
function applyAll(payloads) {
  const place = ({ graph }) => {
    const box = graph.getBoundingClientRect();
    return [outOfView.has(graph) ? 1 : 0, Math.round(box.top), box.left];
  };
  const given = Object.entries(payloads).filter(([key]) => charts.has(key))
    .map(([key, payload]) => ({ ...charts.get(key), payload, at: place(charts.get(key)) }));
  given.sort((a, b) => a.at[0] - b.at[0] || a.at[1] - b.at[1] || a.at[2] - b.at[2]);
  for (const { parentElement, graph, payload } of given) apply(parentElement, graph, payload);
}

window.__metricsLive = { held, apply: applyAll };

// One chart drawn per task, in the order they were given (page order: live_watch.js), each after
// the page had its turn: a long run's chart takes a while to draw, and the browser paints the
// charts drawn so far and answers the user between them, instead of after all of them.  A
// MessageChannel's messages, unlike timers, are not throttled in a background tab.
const turns = new MessageChannel();
const waiting = [];
turns.port1.onmessage = () => waiting.shift()();
let lastTurn = Promise.resolve();

function inTurn(work) {
  const done = lastTurn.then(() => new Promise((resolve) => {
    waiting.push(resolve);
    turns.port2.postMessage(null);
  })).then(work);
  lastTurn = done.catch(() => {});
  return done;
}

// A payload from a rerun (drawChart) or from the route: each seq applied once, an extend only on
// the figure it extends.
function apply(parentElement, graph, data) {
  // Already drawn or being drawn (a rerun with nothing new, or one the route's payloads got ahead of).
  if (graph.dataset.seq === String(data.seq) || graph.dataset.wanted === String(data.seq)) return;
  if (graph.dataset.failed && data.op !== "full") return; // waits for a whole figure (see the catch below)
  const base = data.op === "extend" ? data.base : data.op === "same" ? data.seq : null;
  if (base !== null && graph.dataset.wanted !== String(base)) {
    // This div missed the payload that drew the base (a busy page renders only the latest of
    // several updates) or never drew anything: ask once per missing base, saying what it holds;
    // Python extends that if it still can, else sends the whole figure.
    if (graph.dataset.asked !== String(data.seq)) {
      graph.dataset.asked = String(data.seq);
      const held = graph.dataset.wanted ? Number(graph.dataset.wanted) : null;
      graph.__metricsTrigger("resync", { seq: data.seq, held });
    }
    return;
  }
  if (data.op === "same") return; // drawn, or being drawn: wanted === seq
  graph.dataset.wanted = String(data.seq);
  // Plotly calls are chained so that an extend never runs before the figure it extends is drawn.
  const previous = graph.__metricsDrawn || Promise.resolve();
  const drawn = previous.then(() => window.__metricsPlotly).then((Plotly) => inTurn(() => draw(Plotly, parentElement, graph, data)));
  graph.__metricsDrawn = drawn.catch((error) => failed(parentElement, graph, data.op, data.seq, error));
  // No cleanup: the div survives re-renders, which is what keeps zoom state between updates.
}

function draw(Plotly, parentElement, graph, data) {
  if (graph.dataset.failed && data.op !== "full") return; // queued before an earlier draw failed
  if (data.op === "full") {
    const figure = unpack(JSON.parse(data.figure));
    delete graph.__metricsStale;
    Plotly.react(graph, figure.data, withUserY(graph, figure.layout), CONFIG);
  } else if (outOfView.has(graph) || graph.__metricsStale) { // out of view, or came into view while this waited
    extendData(graph, data.steps);
    const layout = data.layout ? JSON.parse(data.layout) : graph.__metricsStale && graph.__metricsStale.layout;
    if (outOfView.has(graph)) graph.__metricsStale = { layout };
    else {
      delete graph.__metricsStale;
      Plotly.react(graph, graph.data, withUserY(graph, layout) || graph.layout, CONFIG);
    }
  } else {
    extend(Plotly, graph, data.steps);
    if (data.layout) Plotly.react(graph, graph.data, withUserY(graph, JSON.parse(data.layout)), CONFIG);
  }
  graph.dataset.seq = String(data.seq);
  delete graph.dataset.failed;
  note(parentElement, null);
  // Zoom to raw points: tell Python the visible x-range; it answers with that range at full
  // resolution (or the whole run again after a zoom out).  One listener per div, calling the
  // latest component instance.
  if (!graph.__metricsListening) {
    graph.__metricsListening = true;
    graph.on("plotly_relayout", (event) => {
      noteUserY(graph, event);
      const range = xrangeOf(event);
      if (range !== undefined && (range === null || range.every(Number.isFinite))) {
        graph.dataset.zoom = JSON.stringify(range);
        graph.__metricsSetState("xrange", range);
        if (!graph.__metricsFollowing) linkX(graph, event);
      }
    });
  }
}

// A draw that failed leaves the chart holding nothing it can extend: it says so in its place (never
// a chart silently frozen on old data) and, if it was extending, asks for the whole figure, once;
// a whole figure that failed waits for the next one (another would fail the same way).
function failed(parentElement, graph, op, seq, error) {
  console.error("metrics_core: chart not drawn", error);
  delete graph.dataset.seq;
  delete graph.dataset.wanted;
  delete graph.__metricsStale;
  graph.dataset.failed = String(seq);
  const reason = error && error.message ? error.message : String(error);
  if (op === "full") note(parentElement, `This chart could not be drawn (${reason}). Reload the page to try again.`);
  else {
    note(parentElement, `This chart could not be updated (${reason}); it is being drawn again in full.`);
    graph.__metricsTrigger("resync", { seq, held: null });
  }
}

// Linked x: a zoom, pan or reset of one chart moves every other chart of the page on the same
// x-axis (same title: step, tokens, time) to the same range, so cause and effect line up.  Each
// follower reports its new range to Python like a zoom of its own (raw points in that range) but
// passes nothing on: one user gesture, one move per chart.
function linkX(source, event) {
  const title = (layout) => layout && layout.xaxis && layout.xaxis.title && layout.xaxis.title.text;
  const update = event["xaxis.autorange"] === true ? { "xaxis.autorange": true }
    : { "xaxis.range": event["xaxis.range"] || [event["xaxis.range[0]"], event["xaxis.range[1]"]] };
  for (const other of document.querySelectorAll(".metrics-chart")) {
    if (other === source || !other.layout || title(other.layout) !== title(source.layout)) continue;
    other.__metricsFollowing = true;
    window.__metricsPlotly
      .then((Plotly) => Plotly.relayout(other, update))
      .catch((error) => console.error("metrics_core: linked zoom not applied", error))
      .finally(() => { other.__metricsFollowing = false; });
  }
}

// The chart's rows as CSV: a link to the server's route (downloads.py), a constant URL in every
// payload; absent (undefined) where the server has no such route and the page draws a download button.
function csvLink(parentElement, href) {
  let link = parentElement.querySelector(".metrics-chart-csv");
  if (!href) {
    if (link) link.remove();
    return;
  }
  if (!link) {
    link = document.createElement("a");
    link.className = "metrics-chart-csv";
    link.textContent = "CSV of this chart";
    link.setAttribute("download", "");
    link.style.cssText = "color: inherit; opacity: 0.75; font-size: 0.875rem; text-decoration: none;";
    parentElement.appendChild(link);
  }
  if (link.getAttribute("href") !== href) link.setAttribute("href", href);
}

// A line of text under the chart (null: none), set as text, never markup.
function note(parentElement, text) {
  let line = parentElement.querySelector(".metrics-chart-note");
  if (text === null) {
    if (line) line.remove();
    return;
  }
  if (!line) {
    line = document.createElement("div");
    line.className = "metrics-chart-note";
    line.setAttribute("role", "alert");
    line.style.cssText = "color: #d33; font-size: 0.875rem; padding: 0.25rem 0;";
    parentElement.appendChild(line);
  }
  line.textContent = text;
}

// Charts draw through window.__metricsChart once plotly.js is on its way; those whose stubs ran
// before this runtime (live_chart.py's _STUB) are queued.
export default function (component) {
  loadPlotly(component.data && component.data.src);
  window.__metricsChart = drawChart;
  for (const queued of (window.__metricsChartQueue || []).splice(0)) drawChart(queued);
}
