// Models and their replicas: add a model, scale it, stop it, remove it; a replica's engine output,
// followed live. Buttons show only where the caller's roles allow them (roles.js); the control
// plane decides all the same.
import { api } from "../api.js";
import { followText } from "../calls.js";
import { badge, h, problem, section, table } from "../dom.js";
import { follow, refresh } from "../live.js";
import { mayWrite, readsCluster } from "../roles.js";
import { addModelForm } from "./modelform.js";

const LOG_LINES = 2000;

const profilesOf = (m) => (m.definition ? m.definition.profiles || [m.definition.profile] : []);

function scaleForm(model, said) {
  const wanted = model.definition.replicas;
  const count = h("input", { type: "number", min: 0, value: wanted.min, "aria-label": `replicas of ${model.name}`, class: "count", name: "replicas" });
  const put = async (n) => {
    try {
      await api("PUT", `/api/models/${encodeURIComponent(model.name)}/replicas`, { ...wanted, min: n, max: Math.max(n, 1) });
      said.replaceChildren();
      await refresh("models");
    } catch (error) {
      said.replaceChildren(problem(error));
    }
  };
  return h("form", { class: "scale", "data-model": model.name, onsubmit: (event) => { event.preventDefault(); put(Number(count.value)); } },
    count, h("button", { type: "submit" }, "Scale"),
    h("button", { type: "button", class: "stop", title: "0 replicas kept: the last one drains once idle (a request starts one again)", onclick: () => put(0) }, "Stop"));
}

function logPanel() {
  const text = h("pre", { class: "log", id: "replica-log", "aria-live": "polite", tabindex: "0" });  // a keyboard scrolls it
  const title = h("h2", {}, "Replica log");
  const said = h("div");
  let aborter = null;
  const close = () => {
    if (aborter) aborter.abort();
    aborter = null;
    panel.hidden = true;
  };
  const panel = h("section", { class: "panel log-panel", hidden: true },
    h("div", { class: "log-head" }, title, h("button", { type: "button", class: "link", onclick: close }, "Close")), said, text);
  const open = async (replica) => {
    close();
    panel.hidden = false;
    title.textContent = `Log of ${replica.id} (${replica.model} on ${replica.node}), followed`;
    text.textContent = "";
    said.replaceChildren();
    aborter = new AbortController();
    const mine = aborter;
    try {
      await followText(`/api/replicas/${encodeURIComponent(replica.id)}/logs?follow=true&lines=200`, (piece) => {
        const atEnd = text.scrollTop + text.clientHeight >= text.scrollHeight - 4;
        const lines = (text.textContent + piece).split("\n");
        text.textContent = lines.slice(-LOG_LINES).join("\n");
        if (atEnd) text.scrollTop = text.scrollHeight;
      }, mine.signal);
      if (!mine.signal.aborted) said.replaceChildren(h("p", { class: "hint" }, "the log ended: the replica stopped or its node went away"));
    } catch (error) {
      said.replaceChildren(problem(error));
    }
  };
  return { panel, open, close };
}

export function modelsPage(main, params, { me }) {
  const models = h("div");
  const replicas = h("div");
  const said = h("div");
  const logs = logPanel();
  // anyone may add a model: a user owns user:NAME; where else, the owner list says (roles.js)
  const adding = me ? section("Add a model", addModelForm(me, () => refresh("models"))) : null;
  if (adding) adding.id = "add-model-section";
  const watched = me && readsCluster(me) ? ["models", "replicas"] : ["models"];
  main.append(h("h1", {}, "Models and replicas"), said, adding,
    section("Models", models),
    section("Replicas", watched.includes("replicas") ? replicas : h("p", { class: "hint" }, "Replicas and their logs need a viewer's role at the cluster.")),
    logs.panel);

  const remove = async (model) => {
    if (!window.confirm(`Remove the model ${model.name}? Its replicas stop and requests for it are refused.`)) return;
    try {
      await api("DELETE", `/api/models/${encodeURIComponent(model.name)}`);
      said.replaceChildren();
      await refresh("models");
    } catch (error) {
      said.replaceChildren(problem(error));
    }
  };

  let lastModels = null;
  const stop = follow(watched, (views, errors) => {
    if (errors.length) said.replaceChildren(...errors.map(problem));
    if (views.models && views.models !== lastModels) {
      lastModels = views.models;
      const editing = models.contains(document.activeElement) && document.activeElement.matches("input");
      if (!editing) {
        models.replaceChildren(table([
          { title: "Model", value: (m) => m.name },
          { title: "Owner", value: (m) => (m.definition && m.definition.owner) || "cluster" },
          { title: "Engine", value: (m) => profilesOf(m).map((p) => p.engine).join(" → ") || "–" },
          { title: "Serves", value: (m) => profilesOf(m).map((p) => p.serves).filter(Boolean)[0] || "–" },
          { title: "Ready", value: (m) => badge(`${m.ready} / ${m.replicas}`, m.ready ? "ok" : "warn"), class: "num" },
          { title: "Wanted", value: (m) => (m.definition ? `${m.definition.replicas.min}–${m.definition.replicas.max}${m.definition.on_demand ? " on demand" : ""}` : "–"), class: "num" },
          { title: "Note", value: (m) => m.problem || (m.unplaced ? `not placed: ${m.unplaced}` : "") || m.provider_error },
          { title: "", value: (m) => (m.definition && me && mayWrite(me, m.definition.owner || "")
            ? h("div", { class: "actions" }, m.definition.source ? scaleForm(m, said) : null,
              h("button", { type: "button", class: "danger remove", "data-model": m.name, onclick: () => remove(m) }, "Remove"))
            : "") },
        ], views.models, "no models yet"));
      }
    }
    if (views.replicas) {
      replicas.replaceChildren(table([
        { title: "Replica", value: (r) => r.id },
        { title: "Model", value: (r) => r.model },
        { title: "Node", value: (r) => h("a", { href: `#/nodes/${encodeURIComponent(r.node)}` }, r.node) },
        { title: "State", value: (r) => badge(r.draining ? `draining: ${r.draining}` : r.progress || r.state, r.state === "ready" && !r.draining ? "ok" : r.state === "failed" ? "bad" : "warn") },
        { title: "Devices", value: (r) => r.on || "cpu" },
        { title: "Restarts", value: (r) => String(r.restarts), class: "num" },
        { title: "Error", value: (r) => r.error || "" },
        { title: "", value: (r) => h("button", { type: "button", class: "link show-log", "data-replica": r.id, onclick: () => logs.open(r) }, "Log") },
      ], views.replicas, "no replicas"));
    }
  });
  return () => { stop(); logs.close(); };
}
