// The nodes list, and a node's page charting each of its cards over the last hour.
import { get } from "../api.js";
import { badge, h, mib, problem, section, table } from "../dom.js";
import { lineChart, widthOf } from "../charts.js";
import { every, follow } from "../live.js";

const link = (id) => h("a", { href: `#/nodes/${encodeURIComponent(id)}` }, id);
const connected = (n) => badge(n.connected ? "connected" : "away", n.connected ? "ok" : "warn");

export function nodesPage(main) {
  const list = h("div");
  main.append(h("h1", {}, "Nodes"), list);
  return follow(["nodes"], ({ nodes }, errors) => {
    list.replaceChildren(...errors.map(problem), nodes ? table([
      { title: "Node", value: (n) => link(n.id) },
      { title: "State", value: connected },
      { title: "Address", value: (n) => n.address || "–" },
      { title: "CPU cores", value: (n) => String(n.cpu_cores), class: "num" },
      { title: "Memory", value: (n) => mib(n.memory_mb), class: "num" },
      { title: "GPUs", value: (n) => (n.gpus.length ? `${n.gpus.length} × ${[...new Set(n.gpus.map((g) => g.class))].join(", ")}` : "none") },
      { title: "Replicas", value: (n) => String(n.replicas), class: "num" },
    ], nodes, "no nodes yet: 'llmgw node add' or start an agent") : "");
  });
}

/** One card's charts: utilisation and memory (percent), temperature, power; side by side when wide. */
export function cardCharts(card, width) {
  const pts = card.points;
  const memPct = (p) => (p.memory_total_mb ? (100 * p.memory_used_mb) / p.memory_total_mb : null);
  const last = pts.at(-1);
  const head = h("h3", {}, `GPU ${card.label} `, h("span", { class: "muted" }, card.device_class),
    last ? h("span", { class: "reading" }, `${mib(last.memory_used_mb)} of ${mib(last.memory_total_mb)}`,
      last.temperature_c !== null ? ` · ${last.temperature_c} °C` : "", last.power_w !== null ? ` · ${Math.round(last.power_w)} W` : "") : null);
  const load = [{ name: "memory used %", points: pts.map((p) => [p.at_ms, memPct(p)]) }];
  if (pts.some((p) => p.utilization_percent !== null)) load.unshift({ name: "utilisation %", points: pts.map((p) => [p.at_ms, p.utilization_percent]) });
  if (pts.some((p) => p.memory_bandwidth_percent !== null)) load.push({ name: "memory bandwidth %", points: pts.map((p) => [p.at_ms, p.memory_bandwidth_percent]) });
  const charts = [lineChart(load, { unit: "%", yMax: 100, width, title: "Load" })];
  if (pts.some((p) => p.temperature_c !== null)) {
    charts.push(lineChart([{ name: "temperature °C", points: pts.map((p) => [p.at_ms, p.temperature_c]) }], { unit: "°C", width, title: "Temperature" }));
  }
  if (pts.some((p) => p.power_w !== null)) {
    charts.push(lineChart([{ name: "power W", points: pts.map((p) => [p.at_ms, p.power_w]) }], { unit: "W", width, title: "Power" }));
  }
  return h("article", { class: "card", "data-device": card.label }, head, h("div", { class: "charts card-charts" }, charts));
}

export function nodePage(main, [nodeId]) {
  const info = h("div", { class: "tiles" });
  const cards = h("div", { class: "cards" });
  const replicas = h("div");
  const said = h("div");
  main.append(h("p", { class: "crumbs" }, h("a", { href: "#/nodes" }, "Nodes"), " / ", nodeId), h("h1", {}, nodeId), said, info,
    section("GPUs over the last hour", cards), section("Replicas on this node", replicas));
  let history = null;
  const drawCards = () => {
    if (history === null) return;
    const whole = widthOf(cards);
    const width = whole >= 900 ? Math.floor((whole - 32) / 3) : whole; // three charts abreast when wide
    cards.replaceChildren(...(history.length ? history.map((card) => cardCharts(card, width))
      : [h("p", { class: "muted" }, "No GPU readings from this node: it has no cards, or has sent no telemetry yet (every 10 s).")]));
  };
  const off = follow(["nodes", "replicas"], ({ nodes, replicas: all }, errors) => {
    const node = (nodes || []).find((n) => n.id === nodeId);
    said.replaceChildren(...errors.map(problem), nodes && !node ? problem({ message: `there is no node ${nodeId}`, hint: "pick one from the nodes list" }) : "");
    if (node) {
      info.replaceChildren(
        h("div", { class: "tile" }, h("span", { class: "label" }, "State"), connected(node)),
        h("div", { class: "tile" }, h("span", { class: "label" }, "Address"), h("strong", {}, node.address || "–")),
        h("div", { class: "tile" }, h("span", { class: "label" }, "CPU"), h("strong", {}, `${node.cpu_cores} cores`), h("span", { class: "detail" }, mib(node.memory_mb))),
        h("div", { class: "tile" }, h("span", { class: "label" }, "Engines"), h("strong", {}, node.engines.join(", ") || "–")));
    }
    if (all) {
      replicas.replaceChildren(table([
        { title: "Replica", value: (r) => r.id },
        { title: "Model", value: (r) => r.model },
        { title: "State", value: (r) => badge(r.state, r.state === "ready" ? "ok" : "warn") },
        { title: "Devices", value: (r) => r.on || "cpu" },
        { title: "Restarts", value: (r) => String(r.restarts), class: "num" },
      ], all.filter((r) => r.node === nodeId), "no replicas on this node"));
    }
  });
  const stop = every(10000, async () => {
    try {
      history = await get(`/api/gpu-history?node=${encodeURIComponent(nodeId)}`);
      drawCards();
    } catch (error) {
      if (error.status !== 401) cards.replaceChildren(problem(error));
    }
  });
  const resized = () => drawCards();
  window.addEventListener("resize", resized);
  return () => { off(); stop(); window.removeEventListener("resize", resized); };
}
