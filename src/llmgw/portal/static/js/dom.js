// Building elements without innerHTML: every text from the API goes in as text, never as markup.
const SVG_NS = "http://www.w3.org/2000/svg";

function fill(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** An HTML element: h("td", {class: "num"}, "12"). */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element, for the charts. */
export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** A table: columns [{title, value(row) -> text|Node, class}], one line per row; `empty` when none.
 * A column without a title (its buttons) is named "Actions" for screen readers only. */
export function table(columns, rows, empty = "none") {
  const head = h("tr", {}, columns.map((c) => h("th", { class: c.class, scope: "col" }, c.title || h("span", { class: "sr-only" }, "Actions"))));
  const body = rows.length
    ? rows.map((row) => h("tr", {}, columns.map((c) => h("td", { class: c.class, "data-title": c.title }, c.value(row)))))
    : [h("tr", {}, h("td", { class: "empty", colspan: columns.length }, empty))];
  return h("div", { class: "table-wrap" }, h("table", {}, h("thead", {}, head), h("tbody", {}, body)));
}

export function section(title, ...children) {
  return h("section", { class: "panel" }, h("h2", {}, title), ...children);
}

/** A problem said on the page: what was wrong, and what to do. */
export function problem(error) {
  return h("div", { class: "problem", role: "alert" },
    h("strong", {}, error.message || String(error)),
    error.hint ? h("span", { class: "hint" }, error.hint) : null);
}

export function mib(mb) {
  if (mb === null || mb === undefined) return "–";
  return mb >= 1024 ? `${(mb / 1024).toFixed(mb >= 10240 ? 0 : 1)} GiB` : `${mb} MiB`;
}

export function pct(value) {
  return value === null || value === undefined ? "–" : `${Math.round(value)} %`;
}

export function count(n) {
  if (n === null || n === undefined) return "–";
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)} G`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} M`;
  if (n >= 1e4) return `${(n / 1e3).toFixed(1)} k`;
  return String(n);
}

export function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

export function badge(text, kind) {
  return h("span", { class: `badge ${kind || ""}` }, text);
}
