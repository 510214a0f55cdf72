// Draws a plotly figure into the page DOM and redraws it in place with Plotly.react, so that a
// live update keeps the user's zoom and pan (layout.uirevision stays the same across updates).
// plotly.js itself is loaded once per page by the "metrics_plotly_loader" component.
function whenPlotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  return new Promise((resolve) => {
    const timer = setInterval(() => {
      if (window.Plotly) {
        clearInterval(timer);
        resolve(window.Plotly);
      }
    }, 20);
  });
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

export default function (component) {
  const { data, parentElement } = component;
  let graph = parentElement.querySelector(".metrics-chart");
  if (!graph) {
    graph = document.createElement("div");
    graph.className = "metrics-chart";
    graph.style.width = "100%";
    parentElement.appendChild(graph);
  }
  const figure = unpack(JSON.parse(data.figure));
  graph.dataset.revision = String(data.revision);
  whenPlotlyReady().then((Plotly) => {
    Plotly.react(graph, figure.data, figure.layout, { responsive: true, displaylogo: false });
    graph.dataset.drawnRevision = String(data.revision);
  });
  // No cleanup: the div survives re-renders, which is what keeps zoom state between updates.
}
