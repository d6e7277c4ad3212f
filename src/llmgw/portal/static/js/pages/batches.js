// Batches clients made on /v1/batches: how far each is, what it made, and cancelling one.
import { api, get } from "../api.js";
import { badge, count, h, problem, section, table } from "../dom.js";
import { every } from "../live.js";

const RUNNING = new Set(["validating", "in_progress", "finalizing", "cancelling"]);
const FAILED = new Set(["failed", "expired", "cancelled"]);

function progress(b) {
  const answered = b.completed + b.failed;
  const bar = h("progress", { max: Math.max(b.total, 1), value: answered, "aria-label": `${b.id} progress` });
  const failed = b.failed ? `, ${b.failed} failed` : "";
  return h("span", { class: "progress" }, bar, ` ${answered} / ${b.total}${failed}`);
}

function state(b) {
  return badge(b.status.replace("_", " "), b.status === "completed" ? "ok" : FAILED.has(b.status) ? "bad" : "warn");
}

export function batchesPage(main) {
  const running = h("div");
  const ended = h("div");
  const said = h("div");
  main.append(h("h1", {}, "Batches"), said, section("Running", running), section("Ended", ended));

  const cancel = async (b) => {
    try {
      await api("POST", `/api/batches/${encodeURIComponent(b.id)}/cancel`);
      await poll();
    } catch (error) {
      said.replaceChildren(problem(error));
    }
  };
  const columns = (withCancel) => [
    { title: "Batch", value: (b) => b.id },
    { title: "Place", value: (b) => b.owner },
    { title: "Endpoint", value: (b) => b.endpoint },
    { title: "Status", value: state },
    { title: "Progress", value: progress },
    { title: "Tokens", value: (b) => `${count(b.input_tokens)} in, ${count(b.output_tokens)} out`, class: "num" },
    { title: "Made", value: (b) => new Date(b.created_at).toLocaleString() },
    withCancel
      ? { title: "", value: (b) => (b.status === "cancelling" ? "" : h("button", { type: "button", onclick: () => cancel(b) }, "Cancel")) }
      : { title: "Files", value: (b) => [b.output_file_id, b.error_file_id].filter(Boolean).join(", ") || "–" },
  ];

  async function poll() {
    try {
      const batches = await get("/api/batches");
      said.replaceChildren();
      running.replaceChildren(table(columns(true), batches.filter((b) => RUNNING.has(b.status)), "no batch is running"));
      ended.replaceChildren(table(columns(false), batches.filter((b) => !RUNNING.has(b.status)), "no batch has ended yet"));
    } catch (error) {
      if (error.status !== 401) said.replaceChildren(problem(error));
    }
  }
  return every(3000, poll);
}
