// The History page's heat map: a row per GPU (grouped by node), a column per time slice of
// /api/history, coloured by utilisation or by memory, drawn by hand as SVG (no library). A
// column no job held is drawn as free; a held one that stayed cold is pale: idle GPUs stand
// out. Cells: [column, util % | null, peak memory bytes, holder index | -1, jobs].

import { el } from "/static/chart.js";
import { when } from "/static/dates.js";

const ROW = 16;
const GAP = 2;
const HEAD = 20; // px: a node's name above its GPUs
const AXIS = 34;
const GIB = 1024 ** 3;

/** A share from 0 to 1 as a colour: blue (cold), through green and yellow, to red (hot). */
export function heat(share) {
  const s = Math.min(Math.max(share, 0), 1);
  return `hsl(${Math.round(215 - 210 * s)}, ${Math.round(75 + 10 * s)}%, ${Math.round(62 - 14 * s)}%)`;
}

function gib(bytes) {
  const g = bytes / GIB;
  return g >= 10 || g === 0 ? g.toFixed(0) : g.toFixed(1);
}

/** What one cell says, in words (the tooltip line). */
export function cellText(data, node, gpu, cell) {
  const [column, util, mem, holder, jobs] = cell;
  const from = data.start + column * data.width;
  const who = holder >= 0 ? data.holders[holder] : null;
  return [
    `${node.name} GPU ${gpu.index >= 0 ? gpu.index : gpu.uuid}`,
    `${when(from)} – ${when(from + data.width)}`,
    who ? `${who.user}, job ${who.job_id}${jobs > 1 ? ` (+${jobs - 1} more)` : ""}` : "another user's job",
    util === null ? "utilisation unknown" : `util ${util.toFixed(0)} %`,
    `memory ${gib(mem)}${gpu.memory ? ` of ${gib(gpu.memory)}` : ""} GiB`,
  ].join(" · ");
}

function line(cls, text, height) {
  const div = document.createElement("div");
  div.className = cls;
  div.style.height = `${height}px`;
  div.textContent = text;
  return div;
}

/** The map of `data` (/api/history), by `metric` ("util" or "memory"); `tell(text)` is
 * called with a cell's words when it is pointed at or tapped. The GPUs' names stay put in a
 * column of their own while the cells scroll sideways in their box (a phone's screen). */
export function heatMap(data, metric, tell) {
  const columns = data.columns;
  const cw = Math.max(4, Math.floor(960 / columns));
  const width = columns * cw + 8;
  const gpus = data.nodes.reduce((n, node) => n + node.gpus.length, 0);
  const height = data.nodes.length * HEAD + gpus * (ROW + GAP) + AXIS;
  const svg = el("svg", {
    class: "heat",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `GPU ${metric === "memory" ? "memory" : "utilisation"} per GPU over time`,
  });
  const labels = document.createElement("div");
  labels.className = "heat-labels";
  labels.setAttribute("aria-hidden", "true");
  const found = [];
  let y = 0;
  for (const node of data.nodes) {
    labels.append(line("node-name", node.name, HEAD));
    y += HEAD;
    for (const gpu of node.gpus) {
      labels.append(line("gpu-name", gpu.index >= 0 ? `GPU ${gpu.index}` : gpu.uuid.slice(0, 12), ROW + GAP));
      const row = el("g", { class: "gpu-row", "data-gpu-uuid": gpu.uuid });
      row.append(el("rect", { x: 0, y, width: columns * cw, height: ROW, class: "free" }));
      const peak = gpu.memory || Math.max(1, ...gpu.cells.map((c) => c[2]));
      for (const cell of gpu.cells) {
        const [column, util, mem] = cell;
        const value = metric === "memory" ? mem / peak : util === null ? null : util / 100;
        const attrs = { x: column * cw, y, width: cw, height: ROW, class: value === null ? "cell unknown" : "cell", "data-i": found.length };
        if (value !== null) attrs.fill = heat(value);
        row.append(el("rect", attrs));
        found.push([node, gpu, cell]);
      }
      svg.append(row);
      y += ROW + GAP;
    }
  }
  const axis = el("g", { class: "axis" });
  const ticks = Math.min(4, columns);
  for (let i = 0; i <= ticks; i++) {
    const column = Math.round((columns * i) / ticks);
    const x = Math.min(column * cw, columns * cw - 1);
    axis.append(el("line", { x1: x, x2: x, y1: y, y2: y + 5 }));
    const anchor = i === 0 ? "start" : i === ticks ? "end" : "middle";
    axis.append(el("text", { x, y: y + 18, "text-anchor": anchor }, when(data.start + column * data.width)));
  }
  svg.append(axis);
  const point = (event) => {
    const i = event.target.dataset && event.target.dataset.i;
    if (i !== undefined) tell(cellText(data, ...found[Number(i)]));
  };
  svg.addEventListener("pointermove", point);
  svg.addEventListener("click", point);
  svg.dataset.cells = found.length;
  const box = document.createElement("div");
  box.className = "heat-box";
  box.append(svg);
  const map = document.createElement("div");
  map.className = "heat-map";
  map.append(labels, box);
  return map;
}
