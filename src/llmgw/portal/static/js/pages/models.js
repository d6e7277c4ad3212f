// Models and their replicas.
import { badge, h, problem, section, table } from "../dom.js";
import { follow } from "../live.js";

export function modelsPage(main) {
  const models = h("div");
  const replicas = h("div");
  const said = h("div");
  main.append(h("h1", {}, "Models and replicas"), said, section("Models", models), section("Replicas", replicas));
  return follow(["models", "replicas"], (views, errors) => {
    said.replaceChildren(...errors.map(problem));
    if (views.models) {
      models.replaceChildren(table([
        { title: "Model", value: (m) => m.name },
        { title: "Engine", value: (m) => (m.definition ? (m.definition.profiles || [m.definition.profile]).map((p) => p.engine).join(" → ") : "–") },
        { title: "Ready", value: (m) => badge(`${m.ready} / ${m.replicas}`, m.ready ? "ok" : "warn"), class: "num" },
        { title: "Wanted", value: (m) => (m.definition ? `${m.definition.replicas.min}–${m.definition.replicas.max}${m.definition.on_demand ? " on demand" : ""}` : "–"), class: "num" },
        { title: "Note", value: (m) => m.problem || (m.unplaced ? `not placed: ${m.unplaced}` : "") },
      ], views.models, "no models: 'llmgw ctl models add'"));
    }
    if (views.replicas) {
      replicas.replaceChildren(table([
        { title: "Replica", value: (r) => r.id },
        { title: "Model", value: (r) => r.model },
        { title: "Node", value: (r) => h("a", { href: `#/nodes/${encodeURIComponent(r.node)}` }, r.node) },
        { title: "State", value: (r) => badge(r.progress || r.state, r.state === "ready" ? "ok" : "warn") },
        { title: "Devices", value: (r) => r.on || "cpu" },
        { title: "Restarts", value: (r) => String(r.restarts), class: "num" },
        { title: "Error", value: (r) => r.error || "" },
      ], views.replicas, "no replicas"));
    }
  });
}
