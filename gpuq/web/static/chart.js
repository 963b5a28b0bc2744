// The job page's chart: GPU utilisation (%) and GPU memory over time, as inline SVG drawn by
// hand (no chart library). Points: [{at, util, gpu_mem}] with `at` in Unix seconds, `util` in
// percent (absent: unknown) and `gpu_mem` in bytes (a string: a uint64 from the API).

const NS = "http://www.w3.org/2000/svg";
const W = 720;
const H = 260;
const PAD = { left: 48, right: 64, top: 26, bottom: 34 };
const GIB = 1024 ** 3;

/** An SVG element with these attributes (and text): the charts' one way to make one. */
export function el(name, attrs = {}, text) {
  const node = document.createElementNS(NS, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function duration(seconds, fine = false) {
  if (fine) return `${seconds.toFixed(1)}s`;
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}`;
}

function niceMemMax(bytes) {
  const gib = bytes / GIB;
  if (gib <= 0) return GIB;
  const steps = [1, 2, 4, 8, 10, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 512];
  for (const step of steps) if (gib <= step) return step * GIB;
  return Math.ceil(gib / 256) * 256 * GIB;
}

function memLabel(bytes) {
  const gib = bytes / GIB;
  return `${gib >= 10 || gib === 0 ? gib.toFixed(0) : gib.toFixed(1)} GiB`;
}

// A line as an SVG path, broken where a value is unknown (null).
function pathOf(xy) {
  let d = "";
  let pen = false;
  for (const [x, y] of xy) {
    if (y === null) {
      pen = false;
      continue;
    }
    d += `${pen ? "L" : "M"}${x.toFixed(1)} ${y.toFixed(1)}`;
    pen = true;
  }
  return d;
}

/** The chart for `points`; memTotal (bytes): the job's GPUs' memory, the right axis's top. */
export function seriesChart(points, memTotal = 0) {
  const svg = el("svg", {
    viewBox: `0 0 ${W} ${H}`,
    class: "chart",
    role: "img",
    "data-points": points.length,
    "aria-labelledby": "chart-title chart-desc",
  });
  const utilKnown = points.filter((p) => typeof p.util === "number");
  const mems = points.map((p) => Number(p.gpu_mem || 0));
  const peak = mems.length ? Math.max(...mems) : 0;
  svg.append(el("title", { id: "chart-title" }, "GPU utilisation and memory over time"));
  const meanUtil = utilKnown.length
    ? utilKnown.reduce((sum, p) => sum + p.util, 0) / utilKnown.length
    : null;
  svg.append(
    el(
      "desc",
      { id: "chart-desc" },
      `${points.length} samples; ` +
        (meanUtil === null ? "utilisation unknown" : `mean utilisation ${meanUtil.toFixed(0)} %`) +
        `; peak GPU memory ${memLabel(peak)}`,
    ),
  );
  const x0 = PAD.left;
  const x1 = W - PAD.right;
  const y0 = H - PAD.bottom;
  const y1 = PAD.top;
  const memMax = niceMemMax(Math.max(peak, memTotal));
  const t0 = points.length ? points[0].at : 0;
  const span = points.length > 1 ? Math.max(points[points.length - 1].at - t0, 1) : 1;
  const xOf = (at) => x0 + ((at - t0) / span) * (x1 - x0);
  const yUtil = (u) => y0 - (Math.min(Math.max(u, 0), 100) / 100) * (y0 - y1);
  const yMem = (m) => y0 - (Math.min(m, memMax) / memMax) * (y0 - y1);

  const grid = el("g", { class: "grid" });
  for (let i = 0; i <= 4; i++) {
    const y = y0 - (i / 4) * (y0 - y1);
    grid.append(el("line", { x1: x0, x2: x1, y1: y, y2: y }));
    grid.append(el("text", { x: x0 - 6, y: y + 4, class: "axis util-axis", "text-anchor": "end" }, `${i * 25}%`));
    grid.append(el("text", { x: x1 + 6, y: y + 4, class: "axis mem-axis" }, memLabel((memMax * i) / 4)));
  }
  for (let i = 0; i <= 4; i++) {
    const x = x0 + (i / 4) * (x1 - x0);
    grid.append(el("text", { x, y: y0 + 18, class: "axis", "text-anchor": "middle" }, duration((span * i) / 4, span < 10)));
  }
  grid.append(el("line", { x1: x0, x2: x1, y1: y0, y2: y0, class: "base" }));
  svg.append(grid);
  svg.append(el("text", { x: x0, y: 14, class: "legend util-axis" }, "— utilisation (%)"));
  svg.append(el("text", { x: x1, y: 14, class: "legend mem-axis", "text-anchor": "end" }, "— GPU memory"));
  svg.append(el("text", { x: (x0 + x1) / 2, y: H - 2, class: "axis", "text-anchor": "middle" }, "time since first sample"));

  if (!points.length) {
    svg.append(el("text", { x: (x0 + x1) / 2, y: (y0 + y1) / 2, class: "empty", "text-anchor": "middle" }, "no samples yet"));
    return svg;
  }
  const memXY = points.map((p, i) => [xOf(p.at), yMem(mems[i])]);
  const utilXY = points.map((p) => [xOf(p.at), typeof p.util === "number" ? yUtil(p.util) : null]);
  svg.append(el("path", { d: pathOf(memXY), class: "line mem" }));
  svg.append(el("path", { d: pathOf(utilXY), class: "line util" }));
  if (points.length === 1) {
    const [x, y] = memXY[0];
    svg.append(el("circle", { cx: x, cy: y, r: 3, class: "dot mem" }));
    if (utilXY[0][1] !== null) svg.append(el("circle", { cx: x, cy: utilXY[0][1], r: 3, class: "dot util" }));
  }
  return svg;
}
