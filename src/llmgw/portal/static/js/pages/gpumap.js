// The GPU map: every card of the fleet as a tile, coloured by how busy it is.
import { get } from "../api.js";
import { h, mib, problem } from "../dom.js";
import { every, follow } from "../live.js";
import { lastReadings } from "./cluster.js";

/** How busy a card is, 0-100: its utilisation, or its memory in use where it gives none (MIG). */
export function busy(reading) {
  if (!reading) return null;
  if (reading.utilization_percent !== null) return reading.utilization_percent;
  return reading.memory_total_mb ? (100 * reading.memory_used_mb) / reading.memory_total_mb : null;
}

function level(value) {
  if (value === null) return "none";
  return value < 10 ? "idle" : value < 50 ? "low" : value < 85 ? "mid" : "high";
}

export function gpuMapPage(main) {
  const map = h("div", { class: "gpumap" });
  const said = h("div");
  const key = h("p", { class: "map-key" }, "Busy: ", ...["idle", "low", "mid", "high", "none"].map((l) =>
    h("span", { class: `chip level-${l}` }, { idle: "< 10 %", low: "< 50 %", mid: "< 85 %", high: "≥ 85 %", none: "no reading" }[l])));
  main.append(h("h1", {}, "GPU map"), key, said, map);
  let nodes = null;
  let readings = new Map();
  const draw = () => {
    if (!nodes) return;
    const withCards = nodes.filter((n) => n.gpus.length);
    map.replaceChildren(...(withCards.length ? withCards.map((node) => h("div", { class: `map-node${node.connected ? "" : " away"}` },
      h("a", { class: "map-title", href: `#/nodes/${encodeURIComponent(node.id)}` }, node.id, node.connected ? "" : " (away)"),
      h("div", { class: "tiles-grid" }, node.gpus.map((gpu) => {
        const reading = readings.get(`${node.id}/${gpu.index}`);
        const value = busy(reading);
        return h("a", { class: `gpu level-${level(value)}`, href: `#/nodes/${encodeURIComponent(node.id)}`, title: `${node.id} GPU ${gpu.label || gpu.index}: ${gpu.class}` },
          h("span", { class: "gpu-id" }, String(gpu.label || gpu.index)),
          h("span", { class: "gpu-class" }, gpu.class),
          h("span", { class: "gpu-value" }, value === null ? "–" : `${Math.round(value)} %`),
          h("span", { class: "gpu-mem" }, reading ? `${mib(reading.memory_used_mb)} / ${mib(reading.memory_total_mb)}` : mib(gpu.memory_mb)));
      }))))
      : [h("p", { class: "muted" }, "No node has GPUs.")]));
  };
  const off = follow(["nodes"], (views, errors) => {
    nodes = views.nodes || null;
    said.replaceChildren(...errors.map(problem));
    draw();
  });
  const stop = every(10000, async () => {
    try {
      readings = lastReadings(await get("/api/gpu-history?points=1"));
      draw();
    } catch (error) {
      if (error.status !== 401) said.replaceChildren(problem(error));
    }
  });
  return () => { off(); stop(); };
}
