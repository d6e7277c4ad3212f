// Small SVG charts drawn here: lines over time, and bars per time bucket. Drawn at the width of the
// element they go into, so text keeps its size on a phone and on a wide screen.
import { s, h } from "./dom.js";

export const COLORS = ["#1f6feb", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d"];
const PAD = { top: 12, right: 14, bottom: 24, left: 44 };

function niceMax(value) {
  if (!(value > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(value));
  for (const m of [1, 2, 4, 8, 10]) if (m * step >= value) return m * step; // quarters stay whole numbers
  return 10 * step;
}

function timeLabel(ms, spanMs) {
  const d = new Date(ms);
  if (spanMs > 2 * 86400e3) return d.toLocaleDateString([], { month: "short", day: "numeric" });
  if (spanMs < 600e3) return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function legend(series) {
  return h("div", { class: "legend" }, series.map((one, i) =>
    h("span", {}, h("i", { class: "swatch", "data-color": i }), one.name)));
}

function frame(width, height, yMax, unit, xFrom, xTo) {
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const x = (t) => PAD.left + (xTo === xFrom ? plotW / 2 : ((t - xFrom) / (xTo - xFrom)) * plotW);
  const y = (v) => PAD.top + plotH - (v / yMax) * plotH;
  const grid = [];
  for (let i = 0; i <= 4; i++) {
    const v = (yMax * i) / 4;
    grid.push(s("line", { class: "grid", x1: PAD.left, x2: width - PAD.right, y1: y(v), y2: y(v) }));
    const text = Number.isInteger(v) ? String(v) : v.toFixed(1);
    grid.push(s("text", { class: "axis", x: PAD.left - 6, y: y(v) + 4, "text-anchor": "end" }, text));
  }
  const ticks = width < 420 ? 2 : 4;
  for (let i = 0; i <= ticks; i++) {
    const t = xFrom + ((xTo - xFrom) * i) / ticks;
    const anchor = i === 0 ? "start" : i === ticks ? "end" : "middle";
    grid.push(s("text", { class: "axis", x: x(t), y: height - 6, "text-anchor": anchor }, timeLabel(t, xTo - xFrom)));
  }
  grid.push(s("text", { class: "unit", x: PAD.left + 4, y: PAD.top + 10 }, unit));
  return { x, y, grid, plotH };
}

/**
 * Lines over time: series [{name, points: [[ms, value|null], ...]}], on one scale in `unit`
 * (0 to `yMax`, or to the largest value rounded up). A null value breaks the line.
 */
export function lineChart(series, { unit = "", yMax = null, height = 170, width = 600, title = "" } = {}) {
  const all = series.flatMap((one) => one.points);
  const values = all.map((p) => p[1]).filter((v) => v !== null && v !== undefined);
  const times = all.map((p) => p[0]);
  const top = yMax ?? niceMax(Math.max(0, ...values));
  const xFrom = times.length ? Math.min(...times) : Date.now() - 3600e3;
  const xTo = times.length ? Math.max(...times) : Date.now();
  const f = frame(width, height, top, unit, xFrom, xTo);
  const lines = series.map((one, i) => {
    let d = "";
    let pen = false;
    for (const [t, v] of one.points) {
      if (v === null || v === undefined) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${f.x(t).toFixed(1)},${f.y(Math.min(v, top)).toFixed(1)}`;
      pen = true;
    }
    const last = one.points.filter((p) => p[1] !== null && p[1] !== undefined).at(-1);
    return [
      s("path", { class: `line c${i % COLORS.length}`, d, fill: "none", stroke: COLORS[i % COLORS.length] }),
      last ? s("circle", { cx: f.x(last[0]), cy: f.y(Math.min(last[1], top)), r: 2.5, fill: COLORS[i % COLORS.length] }) : null,
    ];
  });
  const empty = values.length ? null : s("text", { class: "axis", x: width / 2, y: height / 2, "text-anchor": "middle" }, "no readings yet");
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": title || unit }, f.grid, lines, empty);
  return h("figure", { class: "chart-box" }, title ? h("figcaption", {}, title) : null, svg, legend(series));
}

/**
 * Bars per time bucket, stacked by series: buckets [ms...], series [{name, values: [n per bucket]}].
 */
export function barChart(buckets, series, { unit = "", height = 190, width = 600, title = "" } = {}) {
  const totals = buckets.map((_, i) => series.reduce((sum, one) => sum + (one.values[i] || 0), 0));
  const top = niceMax(Math.max(0, ...totals));
  const spacing = buckets.length > 1 ? (buckets.at(-1) - buckets[0]) / (buckets.length - 1) : 3600e3;
  const xFrom = (buckets[0] ?? Date.now()) - spacing / 2;
  const xTo = (buckets.at(-1) ?? Date.now()) + spacing / 2;
  const f = frame(width, height, top, unit, xFrom, xTo);
  const barW = Math.max(2, Math.min(40, ((width - PAD.left - PAD.right) / Math.max(1, buckets.length)) * 0.7));
  const bars = [];
  buckets.forEach((t, i) => {
    let base = 0;
    series.forEach((one, j) => {
      const v = one.values[i] || 0;
      if (!v) return;
      const y0 = f.y(base);
      const y1 = f.y(base + v);
      bars.push(s("rect", { x: f.x(t) - barW / 2, y: y1, width: barW, height: Math.max(1, y0 - y1), fill: COLORS[j % COLORS.length] },
        s("title", {}, `${one.name}: ${v} ${unit}`)));
      base += v;
    });
  });
  const empty = buckets.length ? null : s("text", { class: "axis", x: width / 2, y: height / 2, "text-anchor": "middle" }, "no usage in this period");
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": title || unit }, f.grid, bars, empty);
  return h("figure", { class: "chart-box" }, title ? h("figcaption", {}, title) : null, svg, legend(series));
}

/** The width a chart placed in `container` should have (the container's, less its padding). */
export function widthOf(container, fallback = 600) {
  const w = container && container.clientWidth ? container.clientWidth - 2 : fallback;
  return Math.max(240, Math.min(w, 1100));
}
