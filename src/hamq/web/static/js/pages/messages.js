// The message browser: one topic's messages by message id, by key, or at a queue offset,
// each shown with its properties and body.

import { get, vhostQuery } from "../api.js";
import { h, replace, table, fmtTime, fmtInt, errorBox, list } from "../dom.js";

const MODES = {
  id: { label: "Message ID", fields: ["msg_id"] },
  key: { label: "Key", fields: ["key"] },
  offset: { label: "Queue offset", fields: ["broker_name", "queue_id", "offset"] },
};
const LABELS = { msg_id: "Message ID", key: "Key", broker_name: "Group (broker name)", queue_id: "Queue id", offset: "Queue offset" };

export function mount(root, { params }) {
  const topics = h("datalist", { id: "topic-names" });
  const inputs = {
    topic: h("input", { id: "msg-topic", name: "topic", list: "topic-names", required: true, autocomplete: "off", value: params.get("topic") || "" }),
    vhost: h("input", { id: "msg-vhost", name: "vhost", value: params.get("vhost") || "/", autocomplete: "off" }),
  };
  for (const name of Object.keys(LABELS)) {
    inputs[name] = h("input", { id: `msg-${name}`, name, value: params.get(name) || "", autocomplete: "off", type: ["queue_id", "offset"].includes(name) ? "number" : "text", min: "0" });
  }
  let mode = params.get("msg_id") ? "id" : params.get("key") ? "key" : params.has("offset") ? "offset" : "id";
  const tabs = h("div", { class: "tabs", role: "tablist" });
  const fieldBox = h("div", { class: "form-grid" });
  const results = h("div", { id: "message-results" });
  const form = h(
    "form",
    { class: "card", id: "message-form", novalidate: true },
    h("h2", {}, "Find messages"),
    h("div", { class: "form-grid" }, labelled("Topic", inputs.topic), labelled("Virtual host", inputs.vhost)),
    tabs,
    fieldBox,
    h("div", { class: "form-actions" }, h("button", { type: "submit", id: "message-search" }, "Search")),
    topics,
  );
  root.append(form, h("section", { class: "card" }, h("h2", {}, "Results"), results));
  replace(results, h("p", { class: "empty" }, "Pick a topic and a message id, a key or a queue offset, then Search."));

  function showMode() {
    replace(tabs, Object.entries(MODES).map(([m, spec]) => h("button", { type: "button", role: "tab", class: m === mode ? "tab active" : "tab", "aria-selected": String(m === mode), onclick: () => { mode = m; showMode(); } }, spec.label)));
    replace(fieldBox, MODES[mode].fields.map((f) => labelled(LABELS[f], inputs[f])));
  }
  showMode();

  async function search(event) {
    event?.preventDefault();
    const topic = inputs.topic.value.trim();
    const missing = ["topic", ...MODES[mode].fields].find((f) => !inputs[f].value.trim());
    if (missing) {
      replace(results, h("p", { class: "error-box" }, `${LABELS[missing] || "Topic"} is required.`));
      return;
    }
    const q = new URLSearchParams(vhostQuery(inputs.vhost.value.trim()));
    let path = `/api/messages/${encodeURIComponent(topic)}`;
    if (mode === "id") path += `/${encodeURIComponent(inputs.msg_id.value.trim())}`;
    else for (const f of MODES[mode].fields) q.set(f, inputs[f].value.trim());
    const query = q.toString();
    replace(results, h("p", { class: "muted" }, "searching…"));
    try {
      replace(results, messageList(await get(query ? `${path}?${query}` : path)));
    } catch (err) {
      replace(results, err.status === 404 ? h("p", { class: "empty" }, `No message found: ${err.message}`) : errorBox(err));
    }
  }
  form.addEventListener("submit", search);
  if (params.get("topic") && MODES[mode].fields.every((f) => params.get(f))) search();

  let topicsLoaded = false;
  async function refresh() {
    if (topicsLoaded) return; // the lookup is on demand; only the topic names are loaded
    const names = (await get("/api/topics")).filter((t) => t.kind === "normal").map((t) => t.name);
    replace(topics, names.map((n) => h("option", { value: n })));
    topicsLoaded = true;
  }
  return { refresh };
}

function labelled(label, input) {
  return h("div", { class: "field" }, h("label", { for: input.id }, label), input);
}

function messageList({ messages, truncated }) {
  if (messages.length === 0) return h("p", { class: "empty" }, "No message found.");
  return h(
    "div",
    {},
    truncated ? h("p", { class: "notice" }, "The scan stopped at its limit before the start of the queues: older messages may match too.") : null,
    table(
      [
        { label: "Message ID", value: (m) => h("code", {}, m.msg_id) },
        { label: "Tags", value: (m) => m.tags },
        { label: "Keys", value: (m) => (m.keys ? list(m.keys.split(" ")) : null) },
        { label: "Broker", value: (m) => m.broker_name },
        { label: "Queue", value: (m) => m.queue_id, num: true },
        { label: "Offset", value: (m) => fmtInt(m.queue_offset), num: true },
        { label: "Stored", value: (m) => fmtTime(m.store_timestamp) },
        { label: "Reconsumed", value: (m) => m.reconsume_times, num: true },
      ],
      messages,
      "",
      { id: "messages-table" },
    ),
    messages.map(messageDetail),
  );
}

function messageDetail(m) {
  const props = Object.entries(m.properties || {});
  return h(
    "details",
    { class: "message", open: true },
    h("summary", {}, `Message ${m.msg_id} · ${m.broker_name} queue ${m.queue_id} offset ${m.queue_offset}`),
    h(
      "dl",
      { class: "props" },
      h("dt", {}, "Born"), h("dd", {}, fmtTime(m.born_timestamp) ?? "—"),
      h("dt", {}, "Stored"), h("dd", {}, fmtTime(m.store_timestamp) ?? "—"),
      props.map(([k, v]) => [h("dt", {}, k), h("dd", {}, String(v))]),
    ),
    m.properties_error ? h("p", { class: "error-box" }, m.properties_error) : null,
    h("div", { class: "body-head" }, `Body (${m.body_encoding || "utf-8"})`),
    h("pre", { class: "body" }, m.body ?? ""),
  );
}
