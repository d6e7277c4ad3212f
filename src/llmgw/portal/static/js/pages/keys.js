// API keys (create, revoke) and usage charts from /api/usage: tokens, requests and spend.
import { api, get } from "../api.js";
import { barChart, widthOf } from "../charts.js";
import { badge, count, h, problem, section, table, when } from "../dom.js";
import { follow, refresh } from "../live.js";

const PERIODS = {
  day: { label: "last 24 hours, by hour", by: "hour", span: 86400e3, step: 3600e3 },
  month: { label: "last 30 days, by day", by: "day", span: 30 * 86400e3, step: 86400e3 },
};

/** Usage lines to bars: one bucket per step of the period, one series per model. */
export function usageSeries(lines, field, period) {
  const step = period.step;
  const end = Math.floor(Date.now() / step) * step;
  const buckets = [];
  for (let t = end - period.span + step; t <= end; t += step) buckets.push(t);
  const models = [...new Set(lines.map((l) => l.model || "all"))].sort();
  const series = models.map((name) => ({ name, values: buckets.map(() => 0) }));
  for (const line of lines) {
    const at = Math.floor(new Date(line.start).getTime() / step) * step;
    const i = buckets.indexOf(at);
    if (i >= 0) series[models.indexOf(line.model || "all")].values[i] += field(line);
  }
  return { buckets, series };
}

/** An amount of money as finance reads it: the currency's code, two decimals (four below a cent). */
export function money(amount, currency) {
  const digits = amount !== 0 && Math.abs(amount) < 0.01 ? 4 : 2;
  return `${amount.toFixed(digits)} ${currency}`;
}

function createForm(said, shown) {
  const name = h("input", { name: "name", id: "key-name", required: true, maxlength: 100, placeholder: "name, e.g. chat-app" });
  const place = h("input", { name: "place", id: "key-place", placeholder: "project:ORG/TEAM/PROJECT or user:NAME (empty: the cluster)" });
  return h("form", { class: "inline-form", id: "create-key", onsubmit: async (event) => {
    event.preventDefault();
    try {
      const made = await api("POST", "/api/keys", { name: name.value.trim(), place: place.value.trim() });
      shown.replaceChildren(h("div", { class: "secret", role: "status" },
        h("strong", {}, `Key ${made.name} created. Copy it now: it is never shown again.`),
        h("code", { id: "new-key" }, made.key)));
      name.value = "";
      said.replaceChildren();
      await refresh("keys");
    } catch (error) {
      said.replaceChildren(problem(error));
    }
  } }, h("label", { for: "key-name" }, "Name"), name, h("label", { for: "key-place" }, "Place"), place,
  h("button", { type: "submit", class: "primary" }, "Create key"));
}

export function keysPage(main) {
  const said = h("div");
  const shown = h("div");
  const keys = h("div");
  const usage = h("div");
  const choose = h("select", { id: "usage-period", onchange: () => loadUsage() },
    Object.entries(PERIODS).map(([k, p]) => h("option", { value: k }, p.label)));
  main.append(h("h1", {}, "Keys and usage"), said,
    section("Create a key", createForm(said, shown), shown),
    section("Keys", keys),
    section("Usage", h("label", { class: "inline" }, "Period ", choose), usage));

  const revoke = async (key) => {
    if (!window.confirm(`Revoke the key ${key.name}? Requests with it are refused at once.`)) return;
    try {
      await api("DELETE", `/api/keys/${encodeURIComponent(key.id)}`);
      await refresh("keys");
    } catch (error) {
      said.replaceChildren(problem(error));
    }
  };

  async function loadUsage() {
    const period = PERIODS[choose.value];
    const from = new Date(Date.now() - period.span).toISOString();
    try {
      const answer = await get(`/api/usage?by=${period.by}&group_by=model&from=${encodeURIComponent(from)}`);
      const width = widthOf(usage);
      const tokens = usageSeries(answer.lines, (l) => l.prompt_tokens + l.completion_tokens, period);
      const requests = usageSeries(answer.lines, (l) => l.requests, period);
      const currency = answer.currency || "USD";
      const spend = usageSeries(answer.lines, (l) => l.cost || 0, period);
      const sums = new Map();
      for (const l of answer.lines) {
        const one = sums.get(l.model) || { model: l.model, requests: 0, errors: 0, prompt: 0, completion: 0, cost: 0 };
        one.requests += l.requests; one.errors += l.errors; one.prompt += l.prompt_tokens; one.completion += l.completion_tokens;
        one.cost += l.cost || 0;
        sums.set(l.model, one);
      }
      const total = [...sums.values()].reduce((sum, r) => sum + r.cost, 0);
      usage.replaceChildren(
        answer.note ? problem({ message: answer.note }) : "",
        h("div", { class: "charts" },
          barChart(tokens.buckets, tokens.series, { unit: "tokens", width, title: "Tokens (prompt + completion)" }),
          barChart(requests.buckets, requests.series, { unit: "requests", width, title: "Requests" }),
          barChart(spend.buckets, spend.series, { unit: currency, width, title: `Spend (${currency})` })),
        h("p", { id: "usage-spend" }, `Spent in this period: ${money(total, currency)}`),
        table([
          { title: "Model", value: (r) => r.model || "–" },
          { title: "Requests", value: (r) => count(r.requests), class: "num" },
          { title: "Errors", value: (r) => count(r.errors), class: "num" },
          { title: "Prompt tokens", value: (r) => count(r.prompt), class: "num" },
          { title: "Completion tokens", value: (r) => count(r.completion), class: "num" },
          { title: `Cost (${currency})`, value: (r) => money(r.cost, currency), class: "num" },
        ], [...sums.values()], "no requests in this period"));
    } catch (error) {
      usage.replaceChildren(problem(error));
    }
  }
  loadUsage();

  return follow(["keys"], (views, errors) => {
    if (errors.length) said.replaceChildren(...errors.map(problem));
    if (!views.keys) return;
    keys.replaceChildren(table([
      { title: "Name", value: (k) => k.name },
      { title: "Prefix", value: (k) => h("code", {}, k.prefix) },
      { title: "Place", value: (k) => k.place || "cluster" },
      { title: "Created", value: (k) => when(k.created_at) },
      { title: "State", value: (k) => (k.revoked_at ? badge("revoked", "warn") : badge("active", "ok")) },
      { title: "", value: (k) => (k.revoked_at ? "" : h("button", { type: "button", class: "link danger", onclick: () => revoke(k) }, "Revoke")) },
    ], views.keys, "no keys yet"));
  });
}
