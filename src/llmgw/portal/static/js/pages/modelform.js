// The add-model form: a definition's fields, its weights from the mirror, from Hugging Face (pulled
// into the mirror first) or from a preset. The control plane validates the definition: each problem
// of its answer is shown beside the field it names (the rest above the form).
import { api, get } from "../api.js";
import { h, mib, problem } from "../dom.js";
import { writablePlaces } from "../roles.js";

const SERVES = ["chat", "embeddings", "rerank", "images", "jobs"];
const PULL_MS = 1500;

/** The field a problem's location (`profile.ctx_size`, `source.sha256`, …) belongs to: the longest key
 * of `fields` that is the location or a prefix of it; undefined when none is. */
export function fieldOf(location, fields) {
  let best;
  for (const key of fields) {
    if ((location === key || location.startsWith(`${key}.`)) && (!best || key.length > best.length)) best = key;
  }
  return best;
}

const sizeText = (bytes) => (bytes < 1048576 ? `${bytes} B` : mib(Math.round(bytes / 1048576)));

function field(key, label, input, hint) {
  return h("div", { class: "field", "data-field": key },
    h("label", { for: input.id }, label), input,
    hint ? h("span", { class: "hint" }, hint) : null,
    h("span", { class: "field-error", role: "alert", hidden: true }));
}

function number(id, value) {
  return h("input", { id, name: id, type: "number", inputmode: "numeric", value });
}

/** The form; `added(name)` is called once the control plane took the model. */
export function addModelForm(me, added) {
  const said = h("div");
  const how = h("select", { id: "add-from", onchange: () => showSource() },
    h("option", { value: "mirror" }, "a file in the mirror"),
    h("option", { value: "hf" }, "Hugging Face"),
    h("option", { value: "preset" }, "a preset"));
  const blob = h("select", { id: "add-blob" }, h("option", { value: "" }, "loading the mirror…"));
  const hfRepo = h("input", { id: "add-hf", placeholder: "hf:ORG/REPO[@REVISION] or ollama:NAME[:TAG]" });
  const pulled = h("div", { class: "hint", id: "add-pull", role: "status" });
  const preset = h("select", { id: "add-preset", onchange: () => usePreset() }, h("option", { value: "" }, "loading presets…"));
  const presetNeeds = h("span", { class: "hint" });
  const name = h("input", { id: "add-name", name: "name", required: true, placeholder: "the name clients ask for" });
  const owner = h("select", { id: "add-owner" });
  const engine = h("input", { id: "add-engine", value: "llama.cpp", list: "add-engines" });
  const engines = h("datalist", { id: "add-engines" }, ["llama.cpp", "vllm", "sglang", "trtllm", "comfyui"].map((e) => h("option", { value: e })));
  const serves = h("select", { id: "add-serves" }, SERVES.map((s) => h("option", { value: s }, s)));
  const ctx = number("add-ctx", 4096);
  const parallel = number("add-parallel", 4);
  const memory = number("add-memory", "");
  const gpuClass = h("input", { id: "add-gpu-class", placeholder: "any" });
  const min = number("add-min", 1);
  const max = number("add-max", 1);
  const onDemand = h("input", { id: "add-on-demand", type: "checkbox" });
  let pulledSource = null;
  let presets = [];
  let blobs = [];

  const sourceMirror = h("div", { class: "source-mirror" }, field("source", "Weights", blob, "uploaded with 'llmgw mirror import FILE'"));
  const sourceHf = h("div", { class: "source-hf", hidden: true },
    field("source", "Repository", hfRepo, "safetensors from Hugging Face, GGUF from Ollama's registry: pulled into the mirror, each file checked against the registry's checksum"),
    h("button", { type: "button", id: "add-pull-start", onclick: () => pull() }, "Pull into the mirror"), pulled);
  const sourcePreset = h("div", { class: "source-preset", hidden: true }, field("source", "Preset", preset), presetNeeds);

  function showSource() {
    sourceMirror.hidden = how.value !== "mirror";
    sourceHf.hidden = how.value !== "hf";
    sourcePreset.hidden = how.value !== "preset";
  }

  function clearProblems() {
    said.replaceChildren();
    for (const e of form.querySelectorAll(".field-error")) { e.hidden = true; e.textContent = ""; }
    for (const f of form.querySelectorAll(".field.invalid")) f.classList.remove("invalid");
  }

  function showProblems(error) {
    const keys = [...form.querySelectorAll(".field")].filter((f) => !f.closest("[hidden]")).map((f) => f.dataset.field);
    const left = [];
    for (const p of error.problems || []) {
      const key = fieldOf(p.field, keys);
      const box = key && [...form.querySelectorAll(".field")].find((f) => f.dataset.field === key && !f.closest("[hidden]"));
      if (!box) { left.push(`${p.field}: ${p.problem}`); continue; }
      box.classList.add("invalid");
      const e = box.querySelector(".field-error");
      e.hidden = false;
      e.textContent = e.textContent ? `${e.textContent}; ${p.problem}` : p.problem;
    }
    const shown = (error.problems || []).length - left.length;
    said.replaceChildren(problem({ message: shown && !left.length ? "the definition has problems: see the fields marked" : error.message, hint: error.hint }));
  }

  function source() {
    if (how.value === "hf") {
      if (!pulledSource) throw new Error("pull the repository into the mirror first");
      return pulledSource;
    }
    const sha = how.value === "preset" ? presetBlob() : blob.value;
    const picked = blobs.find((b) => b.sha256 === sha);
    if (!picked) return { sha256: sha || "" };
    const base = how.value === "preset" ? (chosenPreset()?.definition.source || {}) : {};
    return { ...base, sha256: picked.sha256, filename: picked.filename, size: picked.size,
      ...(how.value === "mirror" ? { format: picked.filename.endsWith(".gguf") ? "gguf" : "safetensors" } : {}) };
  }

  const chosenPreset = () => presets.find((p) => p.name === preset.value);
  function presetBlob() {
    const p = chosenPreset();
    const file = p && p.definition.source && p.definition.source.filename;
    return (blobs.find((b) => b.filename === file) || {}).sha256 || "";
  }

  function usePreset() {
    const p = chosenPreset();
    if (!p) return;
    const profile = (p.definition.profiles || [p.definition.profile || {}])[0] || {};
    name.value = p.definition.name || p.name;
    engine.value = profile.engine || "llama.cpp";
    serves.value = profile.serves || "chat";
    ctx.value = profile.ctx_size || 4096;
    parallel.value = profile.parallel || 4;
    memory.value = profile.memory_mb || "";
    presetNeeds.textContent = `${p.description} Needs: ${p.needs}`;
  }

  function definition() {
    const base = how.value === "preset" && chosenPreset() ? structuredClone(chosenPreset().definition) : {};
    const profile = { ...((base.profiles || [base.profile || {}])[0] || {}) };
    delete base.profiles;
    const n = (input) => (input.value.trim() === "" ? undefined : Number(input.value));
    Object.assign(profile, { engine: engine.value.trim(), serves: serves.value, ctx_size: n(ctx), parallel: n(parallel) });
    if (n(memory) !== undefined) profile.memory_mb = n(memory); else delete profile.memory_mb;
    if (gpuClass.value.trim()) profile.gpu_class = gpuClass.value.trim();
    const out = { ...base, name: name.value.trim(), source: source(), profile,
      replicas: { ...(base.replicas || {}), min: n(min), max: n(max) }, on_demand: onDemand.checked };
    if (owner.value) out.owner = owner.value; else delete out.owner;
    return JSON.parse(JSON.stringify(out));
  }

  async function pull() {
    clearProblems();
    pulledSource = null;
    try {
      let job = await api("POST", "/api/mirror/pulls", { source: hfRepo.value.trim() });
      while (job.state === "running") {
        pulled.textContent = `pulling ${job.source}: ${sizeText(job.bytes_done)} of ${sizeText(job.bytes_total)}`;
        await new Promise((done) => setTimeout(done, PULL_MS));
        job = await get(`/api/mirror/pulls/${encodeURIComponent(job.id)}`);
      }
      if (job.state === "failed") throw { message: `the pull of ${job.source} failed: ${job.error}`, hint: job.hint };
      pulledSource = job.catalog_source;
      pulled.textContent = `pulled ${job.source} at ${job.revision}: ${pulledSource.filename}`;
      if (!name.value) name.value = job.source.replace(/^(hf|ollama):/, "").split("/").pop().split("@")[0].toLowerCase();
    } catch (error) {
      pulled.textContent = "";
      said.replaceChildren(problem(error));
    }
  }

  const form = h("form", { class: "model-form", id: "add-model", novalidate: true, onsubmit: async (event) => {
    event.preventDefault();
    clearProblems();
    try {
      const made = await api("POST", "/api/models", definition());
      said.replaceChildren(h("div", { class: "secret", role: "status" }, `Model ${made.name} added: its replicas are being placed.`));
      added(made.name);
    } catch (error) {
      if (error.problems) showProblems(error); else said.replaceChildren(problem(error));
    }
  } },
  said,
  h("div", { class: "field" }, h("label", { for: "add-from" }, "Weights from"), how),
  sourceMirror, sourceHf, sourcePreset,
  h("div", { class: "fields" },
    field("name", "Name", name),
    field("owner", "Owner", owner, "who sees and may use it"),
    field("profile.engine", "Engine", engine), engines,
    field("profile.serves", "Serves", serves),
    field("profile.ctx_size", "Context (tokens)", ctx),
    field("profile.parallel", "Parallel requests", parallel),
    field("profile.memory_mb", "Memory (MiB)", memory, "empty: estimated from the weights"),
    field("profile.gpu_class", "GPU class", gpuClass),
    field("replicas.min", "Replicas at least", min),
    field("replicas.max", "Replicas at most", max),
    field("on_demand", "On demand", onDemand, "start when asked, stop when idle")),
  h("button", { type: "submit", class: "primary" }, "Add model"));

  (async () => {
    const units = [];
    for (const kind of ["orgs", "teams", "projects"]) {
      try { units.push(...(await get(`/api/${kind}`)).map((u) => u.owner)); } catch { /* not readable: none offered */ }
    }
    owner.replaceChildren(...writablePlaces(me, units).map((o) => h("option", { value: o }, o || "the cluster (every key)")));
    try {
      blobs = await get("/api/mirror/blobs");
      blob.replaceChildren(h("option", { value: "" }, blobs.length ? "choose a file" : "the mirror is empty"),
        ...blobs.map((b) => h("option", { value: b.sha256 }, `${b.filename} (${sizeText(b.size)}, ${b.sha256.slice(0, 12)}…)`)));
    } catch (error) {
      said.append(problem(error));
    }
    try {
      presets = await get("/api/presets");
      preset.replaceChildren(h("option", { value: "" }, "choose a preset"), ...presets.map((p) => h("option", { value: p.name }, p.name)));
    } catch (error) {
      said.append(problem(error));
    }
  })();
  return form;
}
