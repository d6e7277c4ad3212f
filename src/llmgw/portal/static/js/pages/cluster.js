// The cluster page: what runs, serving on or off, and the cards grouped by class.
import { api, get } from "../api.js";
import { badge, h, mib, pct, problem, section, table } from "../dom.js";
import { every, follow, refresh } from "../live.js";
import { isAdminToken, readsCluster } from "../roles.js";

function tile(label, value, detail) {
  return h("div", { class: "tile" }, h("span", { class: "label" }, label), h("strong", {}, value), detail ? h("span", { class: "detail" }, detail) : null);
}

/** Cards by class: how many, on how many nodes, their memory, and the last readings' means. */
export function byClass(nodes, readings) {
  const classes = new Map();
  for (const node of nodes) {
    for (const gpu of node.gpus) {
      const one = classes.get(gpu.class) || { name: gpu.class, cards: 0, nodes: new Set(), memory: 0, used: 0, util: [], connected: 0 };
      one.cards += 1;
      one.nodes.add(node.id);
      one.memory += gpu.memory_mb;
      if (node.connected) one.connected += 1;
      const last = readings.get(`${node.id}/${gpu.index}`);
      if (last) {
        one.used += last.memory_used_mb;
        if (last.utilization_percent !== null) one.util.push(last.utilization_percent);
      }
      classes.set(gpu.class, one);
    }
  }
  return [...classes.values()].sort((a, b) => a.name.localeCompare(b.name));
}

/** A queue's flows, the largest first: "project:acme/ml/eval 200, project:acme/ml/chat 12". */
export function queueFlows(byFlow) {
  const flows = Object.entries(byFlow || {}).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
  const shown = flows.slice(0, 4).map(([flow, n]) => `${flow || "no key"} ${n}`).join(", ");
  return flows.length > 4 ? `${shown}, ${flows.length - 4} more` : shown || "–";
}

export function lastReadings(history) {
  const out = new Map();
  for (const card of history || []) if (card.points.length) out.set(`${card.node}/${card.device}`, card.points.at(-1));
  return out;
}

export function clusterPage(main, _params = [], context = {}) {
  const me = context.me;
  const seesCards = !me || isAdminToken(me) || readsCluster(me);
  const top = h("div", { class: "tiles" });
  const warnings = h("div");
  const classes = h("div");
  const components = h("div");
  const queues = h("div", { id: "queues" });
  main.append(h("h1", {}, "Cluster"), top, warnings, section("GPUs by class", classes), section("Requests waiting in the gateway", queues), section("Components", components));
  let readings = new Map();
  let views = {};

  const serving = async (stopped) => {
    if (stopped && !window.confirm("Stop serving? Every model goes to no replicas and /v1 answers 503 until you start again.")) return;
    try {
      await api("PUT", "/api/serving", { stopped });
      await Promise.all([refresh("status"), refresh("serving")]);
    } catch (error) {
      warnings.replaceChildren(problem(error));
    }
  };

  const draw = (errors = []) => {
    const { status, nodes } = views;
    if (status) {
      const stopped = status.stopped;
      top.replaceChildren(
        tile("Control plane", status.name, status.leader === status.name ? "leader" : `leader: ${status.leader || "none"}`),
        tile("Serving", stopped ? "stopped" : "serving",
          h("button", { type: "button", class: stopped ? "primary" : "danger", id: "serving-toggle", onclick: () => serving(!stopped) }, stopped ? "Start serving" : "Stop serving")),
        tile("Nodes", String(nodes ? nodes.filter((n) => n.connected).length : status.nodes), nodes ? `${nodes.length} known` : ""),
        tile("Models", String(status.models)),
        tile("Replicas", `${status.replicas_ready} / ${status.replicas}`, "ready / placed"),
        tile("Version", status.version));
      const said = [...errors.map(problem)];
      if (status.reconcile_error) said.push(problem({ message: status.reconcile_error, hint: "see the control plane's log" }));
      for (const [model, why] of Object.entries(status.unplaced || {})) said.push(problem({ message: `${model} is not placed: ${why}`, hint: "add a node with room for it, or lower its replicas" }));
      warnings.replaceChildren(...said);
      queues.replaceChildren(table([
        { title: "Model", value: ([model]) => model },
        { title: "Waiting", value: ([, q]) => badge(String(q.waiting), q.waiting ? "warn" : "ok"), class: "num" },
        { title: "Largest flows", value: ([, q]) => queueFlows(q.by_flow) },
        { title: "Latest wait", value: ([, q]) => (q.last_wait_s === null ? "–" : `${q.last_wait_s.toFixed(2)} s`), class: "num" },
      ], Object.entries(status.queues || {}), "no model has queued: every request found a free slot (or gateway.flow.mode is fifo)"));
      components.replaceChildren(table([
        { title: "Component", value: (c) => c.name },
        { title: "State", value: (c) => badge(c.state, c.state === "running" ? "ok" : "warn") },
        { title: "Restarts", value: (c) => String(c.restarts), class: "num" },
        { title: "Last error", value: (c) => c.last_error || "–" },
      ], status.components || []));
    } else if (errors.length) {
      warnings.replaceChildren(...errors.map(problem));
    }
    if (nodes) {
      classes.replaceChildren(table([
        { title: "Class", value: (c) => h("a", { href: `#/gpus` }, c.name) },
        { title: "Cards", value: (c) => `${c.cards}${c.connected < c.cards ? ` (${c.connected} connected)` : ""}`, class: "num" },
        { title: "Nodes", value: (c) => String(c.nodes.size), class: "num" },
        { title: "Memory", value: (c) => mib(c.memory), class: "num" },
        { title: "In use", value: (c) => (readings.size ? `${mib(c.used)} (${pct((100 * c.used) / Math.max(1, c.memory))})` : "–"), class: "num" },
        { title: "Utilisation", value: (c) => pct(c.util.length ? c.util.reduce((a, b) => a + b, 0) / c.util.length : null), class: "num" },
      ], byClass(nodes, readings), "no GPUs: the nodes have CPUs only"));
    }
  };

  const off = follow(["status", "nodes"], (latest, errors) => { views = latest; draw(errors); });
  // The cards' readings want a viewer at the cluster: a member is not asked them (nor refused).
  const stopPolling = !seesCards ? () => {} : every(10000, async () => {
    try {
      readings = lastReadings(await get("/api/gpu-history?points=1"));
      draw();
    } catch (error) {
      if (error.status !== 401) warnings.replaceChildren(problem(error));
    }
  });
  return () => { off(); stopPolling(); };
}
