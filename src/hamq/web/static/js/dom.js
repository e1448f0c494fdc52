// Small DOM helpers: elements, tables with an empty state, badges and number formats.

export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  fill(el, children);
  return el;
}

function fill(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  fill(el, children);
  return el;
}

// columns: [{label, value: row => text | Node, num: right-aligned}]
export function table(columns, rows, empty, attrs = {}) {
  if (!rows || rows.length === 0) return h("p", { class: "empty" }, empty);
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      attrs,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : "" }, c.label)))),
      h(
        "tbody",
        {},
        rows.map((row) =>
          h(
            "tr",
            row.__attrs || {},
            columns.map((c) => h("td", { class: c.num ? "num" : "" }, cell(c.value(row)))),
          ),
        ),
      ),
    ),
  );
}

function cell(value) {
  if (value === undefined || value === null || value === "") return h("span", { class: "muted" }, "—");
  return value;
}

export function section(title, ...body) {
  return h("section", { class: "card" }, h("h2", {}, title), ...body);
}

export function badge(text, kind = "") {
  return h("span", { class: `badge ${kind}` }, text);
}

export function roleBadge(role) {
  const r = String(role || "").toUpperCase();
  return badge(r || "?", r.includes("MASTER") ? "ok" : r.includes("SLAVE") ? "info" : "");
}

const intFormat = new Intl.NumberFormat("en-US");
export const fmtInt = (n) => (typeof n === "number" ? intFormat.format(n) : n);

export function fmtRate(n) {
  if (typeof n !== "number") return n;
  return `${n >= 100 ? intFormat.format(Math.round(n)) : n.toFixed(1)}/s`;
}

export function fmtTime(ms) {
  if (typeof ms !== "number" || ms <= 0) return ms;
  const d = new Date(ms);
  return `${d.toLocaleDateString("en-CA")} ${d.toLocaleTimeString("en-GB")}`;
}

export function list(items, render = (x) => x, empty = "none") {
  if (!items || items.length === 0) return h("span", { class: "muted" }, empty);
  return h("span", { class: "chips" }, items.map((x) => h("span", { class: "chip" }, render(x))));
}

export function errorBox(err) {
  return h("p", { class: "error-box" }, err.message || String(err));
}

export const link = (href, text) => h("a", { href }, text);
