// The playground: try any model the caller may use, through /v1 as a client would: chat (Chat
// completions or Responses, streamed or whole, with tools and JSON output), embeddings, or a
// picture from a ComfyUI workflow.
//
// /v1 takes a gateway key, not the portal's token, and a key sees what its place sees. So the page
// has the caller pick a place they may create keys at (their own user:NAME, a project they are a
// member of, or for cluster admins the cluster: public models only), and on the first request mints
// a key there (POST /api/keys, named "playground NAME TIME" so it reads as such in the keys list).
// The secret stays in this module's memory only, never in storage or the page's text; the key is
// revoked when the page is left, the place changes, or the tab goes away. The models offered are
// those the place sees, as the gateway decides it (roles.js, visibleFrom).
import { api, authorization, get } from "../api.js";
import { v1, v1Stream } from "../calls.js";
import { h, problem, section } from "../dom.js";
import { follow } from "../live.js";
import { RANK, roleOver, visibleFrom, writablePlaces } from "../roles.js";
import { curl, python } from "../snippets.js";

const TRIED = new Set(["chat", "embeddings", "images"]);

/** What a model serves: its first profile's `serves`; a ComfyUI workflow making pictures serves images. */
export function servesOf(m) {
  const d = m.definition || {};
  const serves = ((d.profiles || [d.profile])[0] || {}).serves || "chat";
  if (d.comfyui && serves === "chat") return (d.comfyui.outputs || "image") === "image" ? "images" : "jobs";
  return serves;
}

/** A key minted for the playground at one place, revoked when done with. */
function keyKeeper(me) {
  let held = null; // { id, key, place }
  const revoke = (keepalive) => {
    if (!held) return;
    const { id } = held;
    held = null;
    if (keepalive) {
      fetch(`/api/keys/${encodeURIComponent(id)}`, { method: "DELETE", keepalive: true, headers: authorization() });
      return;
    }
    api("DELETE", `/api/keys/${encodeURIComponent(id)}`).catch((error) => console.warn("llmgw portal: the playground's key was not revoked", error));
  };
  const keyFor = async (place) => {
    if (held && held.place === place) return held.key;
    revoke(false);
    const made = await api("POST", "/api/keys", { name: `playground ${me.name} ${new Date().toISOString()}`, owner: "portal playground", place });
    held = { id: made.id, key: made.key, place };
    return made.key;
  };
  return { keyFor, revoke };
}

export function playgroundPage(main, params, { me }) {
  const keys = keyKeeper(me);
  const said = h("div");
  const place = h("select", { id: "pg-place" });
  const model = h("select", { id: "pg-model" });
  const system = h("textarea", { id: "pg-system", rows: 2, placeholder: "You are a helpful assistant." });
  const prompt = h("textarea", { id: "pg-prompt", rows: 3, placeholder: "Say something" });
  const temperature = h("input", { id: "pg-temperature", type: "number", step: "0.1", min: 0, max: 2, placeholder: "engine default" });
  const maxTokens = h("input", { id: "pg-max-tokens", type: "number", min: 1, placeholder: "engine default" });
  const json = h("input", { id: "pg-json", type: "checkbox" });
  const via = h("select", { id: "pg-api" }, h("option", { value: "chat" }, "Chat completions"), h("option", { value: "responses" }, "Responses"));
  const stream = h("input", { id: "pg-stream", type: "checkbox", checked: true });
  const size = h("input", { id: "pg-size", placeholder: "WIDTHxHEIGHT (the workflow's own)" });
  const tools = h("textarea", { id: "pg-tools", rows: 3, placeholder: '[{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]' });
  const transcript = h("div", { class: "transcript", id: "pg-transcript", "aria-live": "polite" });
  // focusable (tabindex 0), so a keyboard can scroll what is wider than the screen
  const curlText = h("pre", { class: "code", id: "pg-curl", tabindex: "0", "aria-label": "the request as curl" });
  const pythonText = h("pre", { class: "code", id: "pg-python", tabindex: "0", "aria-label": "the request in Python" });
  const send = h("button", { type: "submit", class: "primary", id: "pg-send" }, "Send");
  const stopButton = h("button", { type: "button", id: "pg-stop", hidden: true, onclick: () => aborter && aborter.abort() }, "Stop");
  const clear = h("button", { type: "button", onclick: () => { history = []; transcript.replaceChildren(); show(); } }, "New conversation");
  const chatOnly = h("div", { class: "chat-only fields" }, labelled("API", via),
    labelled("Temperature", temperature), labelled("Max tokens", maxTokens),
    labelled("JSON output", json, "response_format: json_object"), labelled("Stream", stream));
  const toolsBox = h("div", { class: "field chat-only" }, h("label", { for: "pg-tools" }, "Tools (JSON list, optional)"), tools,
    h("span", { class: "field-error", id: "pg-tools-error", role: "alert", hidden: true }));
  const systemBox = h("div", { class: "field chat-only" }, h("label", { for: "pg-system" }, "System prompt"), system);
  const sizeBox = h("div", { class: "fields images-only" }, labelled("Size", size));
  let history = [];
  let models = [];
  let aborter = null;

  function labelled(text, input, hint) {
    return h("div", { class: "field" }, h("label", { for: input.id }, text), input, hint ? h("span", { class: "hint" }, hint) : null);
  }

  const chosen = () => models.find((m) => m.name === model.value);
  const mode = () => (chosen() ? servesOf(chosen()) : "chat");

  function parsedTools() {
    const box = toolsBox.querySelector(".field-error");
    box.hidden = true;
    if (!tools.value.trim()) return undefined;
    try {
      const value = JSON.parse(tools.value);
      if (!Array.isArray(value)) throw new Error("a JSON list of tools is wanted");
      return value;
    } catch (error) {
      box.hidden = false;
      box.textContent = `not a JSON list of tools: ${error.message}`;
      return null;
    }
  }

  /** The request the form says: its /v1 path and body. */
  function request() {
    if (mode() === "embeddings") return { path: "/embeddings", body: { model: model.value, input: prompt.value } };
    if (mode() === "images") {
      const body = { model: model.value, prompt: prompt.value, n: 1, response_format: "b64_json" };
      if (size.value.trim()) body.size = size.value.trim();
      return { path: "/images/generations", body };
    }
    const t = parsedTools();
    if (via.value === "responses") {
      const body = { model: model.value };
      if (system.value.trim()) body.instructions = system.value;
      body.input = [...history, { role: "user", content: prompt.value }]
        .map((m) => ({ type: "message", role: m.role, content: m.content || "" }));
      if (temperature.value !== "") body.temperature = Number(temperature.value);
      if (maxTokens.value !== "") body.max_output_tokens = Number(maxTokens.value);
      if (json.checked) body.text = { format: { type: "json_object" } };
      // the Responses API names a function tool's fields at its top level
      if (t) body.tools = t.map((tool) => (tool && tool.function ? { type: "function", ...tool.function } : tool));
      if (stream.checked) body.stream = true;
      return { path: "/responses", body };
    }
    const messages = [];
    if (system.value.trim()) messages.push({ role: "system", content: system.value });
    messages.push(...history, { role: "user", content: prompt.value });
    const body = { model: model.value, messages };
    if (temperature.value !== "") body.temperature = Number(temperature.value);
    if (maxTokens.value !== "") body.max_tokens = Number(maxTokens.value);
    if (json.checked) body.response_format = { type: "json_object" };
    if (t) body.tools = t;
    if (stream.checked) body.stream = true;
    return { path: "/chat/completions", body };
  }

  /** What a Responses answer or event adds to the text and tool calls: `take` as a chat delta would. */
  function fromResponses(item, take) {
    if (item.type === "response.output_text.delta") take({ content: item.delta });
    else if (item.type === "response.output_item.done" && item.item.type === "function_call") {
      take({ tool_calls: [{ id: item.item.call_id, function: { name: item.item.name, arguments: item.item.arguments } }] });
    } else if (item.type === "response.failed") {
      throw new Error((item.response && item.response.error && item.response.error.message) || "the response failed");
    } else if (item.object === "response") {
      for (const out of item.output || []) {
        if (out.type === "message") for (const part of out.content || []) if (part.type === "output_text") take({ content: part.text });
        if (out.type === "function_call") fromResponses({ type: "response.output_item.done", item: out }, take);
      }
    }
  }

  function show() {
    const now = mode();
    for (const el of main.querySelectorAll(".chat-only")) el.hidden = now !== "chat";
    for (const el of main.querySelectorAll(".images-only")) el.hidden = now !== "images";
    prompt.placeholder = { embeddings: "Text to embed", images: "What the picture shows" }[now] || "Say something";
    const { path, body } = request();
    curlText.textContent = curl(location.origin, path, body);
    pythonText.textContent = python(location.origin, path, body);
  }

  function bubble(role, text) {
    const body = h("div", { class: "text" }, text);
    const one = h("div", { class: `turn ${role}`, "data-role": role }, h("span", { class: "who" }, role), body);
    transcript.append(one);
    return body;
  }

  async function run() {
    said.replaceChildren();
    if (!model.value) return said.replaceChildren(problem({ message: "no model to try", hint: "choose a place whose keys see a model, or add one on the models page" }));
    const { path, body } = request();
    if (body.tools === undefined && parsedTools() === null) return;
    aborter = new AbortController();
    send.disabled = true;
    stopButton.hidden = false;
    try {
      const key = await keys.keyFor(place.value);
      if (path === "/embeddings") {
        const answer = await v1(key, path, body, aborter.signal);
        const vector = answer.data[0].embedding;
        bubble("embedding", `${vector.length} dimensions: [${vector.slice(0, 8).map((x) => x.toFixed(4)).join(", ")}, …]`);
        return;
      }
      if (path === "/images/generations") {
        const answer = await v1(key, path, body, aborter.signal);
        const picture = bubble("picture", "");
        picture.append(h("img", { src: `data:image/png;base64,${answer.data[0].b64_json}`, alt: body.prompt, class: "picture" }));
        picture.parentElement.dataset.done = "true";
        return;
      }
      bubble("user", prompt.value);
      const out = bubble("assistant", "");
      out.classList.add("streaming");
      let text = "";
      const calls = [];
      const take = (message) => {
        if (message.content) text += message.content;
        for (const call of message.tool_calls || []) {
          const at = call.index ?? calls.length;
          calls[at] = calls[at] || { id: call.id, type: "function", function: { name: "", arguments: "" } };
          if (call.function && call.function.name) calls[at].function.name += call.function.name;
          if (call.function && call.function.arguments) calls[at].function.arguments += call.function.arguments;
        }
        out.textContent = text + calls.map((c) => `\n→ ${c.function.name}(${c.function.arguments})`).join("");
      };
      if (path === "/responses") {
        if (body.stream) await v1Stream(key, path, body, (event) => fromResponses(event, take), aborter.signal);
        else fromResponses(await v1(key, path, body, aborter.signal), take);
      } else if (body.stream) {
        await v1Stream(key, path, body, (chunk) => { if (chunk.choices && chunk.choices[0]) take(chunk.choices[0].delta || {}); }, aborter.signal);
      } else {
        const answer = await v1(key, path, body, aborter.signal);
        take(answer.choices[0].message);
      }
      out.classList.remove("streaming");
      out.parentElement.dataset.done = "true";
      const reply = { role: "assistant", content: text };
      if (calls.length && path === "/chat/completions") reply.tool_calls = calls;
      history.push({ role: "user", content: prompt.value }, reply);
      prompt.value = "";
    } catch (error) {
      if (error.name === "AbortError") said.replaceChildren(h("p", { class: "hint" }, "stopped"));
      else said.replaceChildren(problem(error));
    } finally {
      aborter = null;
      send.disabled = false;
      stopButton.hidden = true;
      show();
    }
  }

  const form = h("form", { class: "playground", id: "playground", novalidate: true, oninput: show, onchange: show,
    onsubmit: (event) => { event.preventDefault(); run(); } },
  h("div", { class: "fields" },
    labelled("Use as", place, "a key is made here for this page and revoked when you leave it"),
    labelled("Model", model)),
  systemBox, chatOnly, toolsBox, sizeBox,
  h("div", { class: "field" }, h("label", { for: "pg-prompt" }, "Message"), prompt),
  h("div", { class: "inline-form" }, send, stopButton, clear));

  main.append(h("h1", {}, "Playground"), said,
    section("Try a model", form, transcript),
    section("The same request", h("h3", {}, "curl"), curlText, h("h3", {}, "Python (openai)"), pythonText,
      h("p", { class: "hint" }, "Set LLMGW_API_KEY to a key of yours (Keys & usage).")));

  function offerModels() {
    const keep = model.value;
    const usable = models.filter((m) => m.definition && TRIED.has(servesOf(m)) && visibleFrom(m.definition.owner || "", place.value, me));
    model.replaceChildren(...(usable.length ? usable.map((m) => h("option", { value: m.name }, `${m.name} (${servesOf(m)}${m.ready ? "" : ", not ready"})`))
      : [h("option", { value: "" }, "no model this place may use")]));
    if (usable.some((m) => m.name === keep)) model.value = keep;
    show();
  }
  place.addEventListener("change", () => { keys.revoke(false); offerModels(); });

  (async () => {
    let projects = [];
    try { projects = (await get("/api/projects")).map((p) => p.owner); } catch { /* none readable */ }
    const places = writablePlaces(me, projects)
      // a key sits in a project or with a user; one at the cluster (public models only) is a cluster admin's
      .filter((p) => (p === "" ? roleOver(me, "") >= RANK["cluster-admin"] : p.startsWith("user:") || p.startsWith("project:")));
    place.replaceChildren(...places.map((p) => h("option", { value: p }, p || "the cluster (public models)")));
    offerModels();
  })();

  const gone = () => keys.revoke(true);
  window.addEventListener("pagehide", gone);
  const stop = follow(["models"], (views, errors) => {
    if (errors.length) said.replaceChildren(...errors.map(problem));
    if (views.models) { models = views.models; offerModels(); }
  });
  return () => {
    stop();
    if (aborter) aborter.abort();
    window.removeEventListener("pagehide", gone);
    keys.revoke(false);
  };
}
