// Settings: each one's value, changing one, and the history of changes.
import { api, get } from "../api.js";
import { h, problem, section, table, when } from "../dom.js";
import { follow, refresh } from "../live.js";

/** A value as typed: JSON where it parses (3, true, "x", [..]), else the text itself. */
export function parseValue(text) {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

const show = (value) => (typeof value === "string" ? value : JSON.stringify(value));

export function settingsPage(main) {
  const said = h("div");
  const list = h("div");
  const history = h("div");
  const key = h("input", { id: "setting-key", name: "key", required: true, placeholder: "e.g. firewall.enabled" });
  const value = h("input", { id: "setting-value", name: "value", required: true, placeholder: "value (JSON or text)" });

  const loadHistory = async () => {
    try {
      const changes = await get("/api/settings-history");
      history.replaceChildren(table([
        { title: "When", value: (c) => when(c.at) },
        { title: "Setting", value: (c) => c.key },
        { title: "Value", value: (c) => (c.deleted ? "(back to default)" : h("code", {}, show(c.value))) },
        { title: "By", value: (c) => c.actor },
      ], changes, "no changes yet"));
    } catch (error) {
      history.replaceChildren(problem(error));
    }
  };

  const set = async (name, raw) => {
    try {
      await api("PUT", `/api/settings/${name.split("/").map(encodeURIComponent).join("/")}`, { value: parseValue(raw) });
      said.replaceChildren();
      await Promise.all([refresh("settings"), loadHistory()]);
      return true;
    } catch (error) {
      said.replaceChildren(problem(error));
      return false;
    }
  };

  const form = h("form", { class: "inline-form", id: "set-setting", onsubmit: async (event) => {
    event.preventDefault();
    if (await set(key.value.trim(), value.value)) value.value = "";
  } }, h("label", { for: "setting-key" }, "Setting"), key, h("label", { for: "setting-value" }, "Value"), value,
  h("button", { type: "submit", class: "primary" }, "Set"));

  main.append(h("h1", {}, "Settings"), said, section("Change a setting", form), section("Settings", list), section("History", history));
  loadHistory();
  return follow(["settings"], (views, errors) => {
    if (errors.length) said.replaceChildren(...errors.map(problem));
    if (!views.settings) return;
    const rows = Object.entries(views.settings).sort(([a], [b]) => a.localeCompare(b));
    list.replaceChildren(table([
      { title: "Setting", value: ([k]) => k },
      { title: "Value", value: ([, v]) => h("code", {}, show(v)) },
      { title: "", value: ([k, v]) => h("button", { type: "button", class: "link", onclick: () => { key.value = k; value.value = show(v); value.focus(); } }, "Edit") },
    ], rows, "no settings set: every one has its default"));
  });
}
