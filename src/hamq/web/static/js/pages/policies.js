// Policies, as RabbitMQ's "Admin > Policies": the list, and one form that adds a policy or
// updates the one of the same vhost and name (PUT /api/policies/{vhost}/{name}); delete asks
// once more. An error the API names a field of is shown next to that field.

import { api, getAll, seg, ApiError } from "../api.js";
import { h, replace, section, table, errorBox } from "../dom.js";

// The definition keys hamq knows (policy/definition.py), with what each takes.
const KEYS = {
  "ha-mode": ["String", "all | exactly | nodes"],
  "ha-params": ["Number", "exactly: a count of nodes; nodes: a list of hamq@host names"],
  "ha-sync-mode": ["String", "manual | automatic"],
  "ha-sync-batch-size": ["Number", "messages per sync batch (default 4096)"],
  "ha-promote-on-shutdown": ["String", "when-synced | always"],
  "ha-promote-on-failure": ["String", "when-synced | always"],
  "queue-master-locator": ["String", "where a new topic's master goes"],
};
const TYPES = ["String", "Number", "List"];
const CONFIRM_MS = 4000;
// "vhost/name" -> until when a first Delete click stands; kept apart from the table, which
// each refresh rebuilds (a second click after a refresh must still delete)
const asked = new Map();

export function mount(root, { refreshNow }) {
  const listing = h("div");
  // what a Delete ended in; outside the listing, so the refresh after it does not wipe it
  const notice = h("p", { id: "policies-notice", class: "error-box", role: "status", hidden: true });
  const form = policyForm(async () => refreshNow());
  root.append(section("Policies", notice, listing), form.el);
  const deleted = (text) => {
    notice.textContent = text || "";
    notice.hidden = !text;
  };

  async function refresh() {
    const r = await getAll({ policies: "/api/policies", vhosts: "/api/vhosts" });
    if (r.vhosts.data) form.setVhosts(r.vhosts.data.map((v) => v.name));
    if (r.policies.error) {
      replace(listing, errorBox(r.policies.error));
      throw r.policies.error;
    }
    replace(listing, policyTable(r.policies.data, form, () => refreshNow(), deleted));
  }
  return { refresh };
}

function definitionChips(definition) {
  return h(
    "span",
    { class: "chips" },
    Object.entries(definition || {}).map(([k, v]) => h("span", { class: "chip" }, `${k}: ${Array.isArray(v) ? v.join(", ") : v}`)),
  );
}

function policyTable(policies, form, refreshNow, deleted) {
  const rows = policies
    .slice()
    .sort((a, b) => `${a.vhost}\u0000${a.name}`.localeCompare(`${b.vhost}\u0000${b.name}`))
    .map((p) => ({ ...p, __attrs: { "data-policy": `${p.vhost}/${p.name}` } }));
  return table(
    [
      { label: "Vhost", value: (p) => p.vhost },
      { label: "Name", value: (p) => h("strong", {}, p.name) },
      { label: "Pattern", value: (p) => h("code", {}, p.pattern) },
      { label: "Apply to", value: (p) => p["apply-to"] },
      { label: "Definition", value: (p) => definitionChips(p.definition) },
      { label: "Priority", value: (p) => p.priority, num: true },
      {
        label: "Actions",
        value: (p) =>
          h(
            "span",
            { class: "actions" },
            h("button", { type: "button", class: "small secondary", onclick: () => form.edit(p) }, "Edit"),
            deleteButton(p, refreshNow, deleted),
          ),
      },
    ],
    rows,
    "No policies. Add one below: topics whose name matches its pattern get mirrored as its definition says.",
    { id: "policies-table" },
  );
}

function deleteButton(p, refreshNow, deleted) {
  const key = `${p.vhost}/${p.name}`;
  const button = h("button", { type: "button", class: "small danger" }, "Delete");
  const standing = () => (asked.get(key) ?? 0) > Date.now();
  const show = () => {
    button.textContent = standing() ? "Really delete?" : "Delete";
    if (standing()) setTimeout(show, asked.get(key) - Date.now());
  };
  show();
  button.addEventListener("click", async () => {
    if (!standing()) {
      asked.set(key, Date.now() + CONFIRM_MS); // a second click within a few seconds deletes
      show();
      return;
    }
    asked.delete(key);
    button.disabled = true;
    deleted(null);
    try {
      await api("DELETE", `/api/policies/${seg(p.vhost)}/${seg(p.name)}`);
    } catch (err) {
      const gone = err instanceof ApiError && err.status === 404;
      deleted(gone ? `Policy ${p.name} in vhost ${p.vhost} no longer exists: another client deleted it.` : `Deleting policy ${p.name} in vhost ${p.vhost} failed: ${err.message}`);
    }
    refreshNow();
  });
  return button;
}

function field(label, input, name, help) {
  return h(
    "div",
    { class: "field" },
    h("label", { for: input.id }, label),
    input,
    help ? h("div", { class: "help" }, help) : null,
    h("div", { class: "field-error", "data-error-for": name, role: "alert" }),
  );
}

function policyForm(onSaved) {
  const vhost = h("select", { id: "policy-vhost", name: "vhost" }, h("option", { value: "/" }, "/"));
  const name = h("input", { id: "policy-name", name: "name", required: true, autocomplete: "off", placeholder: "ha-all" });
  const pattern = h("input", { id: "policy-pattern", name: "pattern", required: true, autocomplete: "off", placeholder: "^ha\\." });
  const applyTo = h("select", { id: "policy-apply-to", name: "apply-to" }, h("option", { value: "topics" }, "Topics (queues)"), h("option", { value: "all" }, "All"));
  const priority = h("input", { id: "policy-priority", name: "priority", type: "number", value: "0", step: "1" });
  const rows = h("div", { class: "kv-rows", id: "definition-rows" });
  const json = h("textarea", { id: "policy-json", name: "definition-json", rows: "5", spellcheck: "false", hidden: true, placeholder: '{"ha-mode": "all"}' });
  const asJson = h("input", { type: "checkbox", id: "definition-as-json" });
  const general = h("div", { class: "field-error", "data-error-for": "", role: "alert" });
  const done = h("p", { class: "notice ok", hidden: true, role: "status" });
  const submit = h("button", { type: "submit", id: "policy-submit" }, "Add / update policy");
  const datalist = h("datalist", { id: "definition-keys" }, Object.keys(KEYS).map((k) => h("option", { value: k })));

  function addRow(key = "", value = "", type = "String") {
    const keyInput = h("input", { class: "kv-key", list: "definition-keys", value: key, placeholder: "ha-mode", "aria-label": "definition key" });
    const valueInput = h("input", { class: "kv-value", value, placeholder: "all", "aria-label": "definition value" });
    const typeSelect = h("select", { class: "kv-type", "aria-label": "value type" }, TYPES.map((t) => h("option", { value: t, selected: t === type }, t)));
    const hint = h("div", { class: "help" }, KEYS[key]?.[1] ?? "");
    const error = h("div", { class: "field-error" });
    const row = h(
      "div",
      { class: "kv-row" },
      keyInput,
      h("span", { class: "eq" }, "="),
      valueInput,
      typeSelect,
      h("button", { type: "button", class: "small secondary", title: "Remove this key", onclick: () => row.remove() }, "×"),
      hint,
      error,
    );
    keyInput.addEventListener("change", () => {
      const known = KEYS[keyInput.value.trim()];
      hint.textContent = known ? known[1] : "";
      if (known) typeSelect.value = known[0];
    });
    row.error = error;
    rows.append(row);
    return row;
  }

  function rowValue(row) {
    const [key, value, type] = [row.querySelector(".kv-key").value.trim(), row.querySelector(".kv-value").value.trim(), row.querySelector(".kv-type").value];
    if (type === "Number") {
      if (!/^-?\d+$/.test(value)) throw fieldError(`definition.${key}`, `${key}: "${value}" is not a whole number`);
      return [key, Number(value)];
    }
    if (type === "List") return [key, value.split(",").map((s) => s.trim()).filter(Boolean)];
    return [key, value];
  }

  function jsonDefinition() {
    let parsed;
    try {
      parsed = JSON.parse(json.value);
    } catch (err) {
      throw fieldError("definition", `not JSON: ${err.message}`);
    }
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw fieldError("definition", "must be a JSON object of policy keys");
    return parsed;
  }

  function rowsDefinition() {
    return Object.fromEntries([...rows.children].filter((r) => r.querySelector(".kv-key").value.trim()).map(rowValue));
  }

  const definition = () => (asJson.checked ? jsonDefinition() : rowsDefinition());

  function setRows(def) {
    rows.replaceChildren();
    for (const [k, v] of Object.entries(def)) {
      if (Array.isArray(v)) addRow(k, v.join(", "), "List");
      else addRow(k, String(v), typeof v === "number" ? "Number" : "String");
    }
    if (!rows.children.length) addRow();
  }

  // The API's field ("definition.ha-mode", "apply-to", "pattern", ...) -> where to say it.
  function errorSlot(fieldName) {
    const f = fieldName || "";
    if (f.startsWith("definition.") && !asJson.checked) {
      const key = f.slice("definition.".length);
      const row = [...rows.children].find((r) => r.querySelector(".kv-key").value.trim() === key);
      if (row) return row.error;
    }
    const name = f.startsWith("definition") ? "definition" : f;
    return el.querySelector(`[data-error-for="${CSS.escape(name)}"]`) || general;
  }

  function clearErrors() {
    el.querySelectorAll(".field-error").forEach((e) => (e.textContent = ""));
    el.querySelectorAll(".invalid").forEach((e) => e.classList.remove("invalid"));
  }

  async function save(event) {
    event.preventDefault();
    clearErrors();
    done.hidden = true;
    const body = { pattern: pattern.value, "apply-to": applyTo.value, priority: Number(priority.value || 0) };
    try {
      // PUT /api/policies/%2F/ is no route: say what is missing where it goes
      if (!name.value.trim()) throw fieldError("name", "a policy needs a name");
      body.definition = definition();
      submit.disabled = true;
      const path = `/api/policies/${seg(vhost.value)}/${seg(name.value.trim())}`;
      await api("PUT", path, body);
      done.textContent = `Saved policy ${name.value.trim()} in vhost ${vhost.value}.`;
      done.hidden = false;
      onSaved();
    } catch (err) {
      // a field the API names is marked where it is; anything else is said under the form
      const slot = errorSlot(err instanceof ApiError || err.field ? err.field : null);
      slot.textContent = err.message;
      if (slot !== general) slot.parentElement.classList.add("invalid");
    } finally {
      submit.disabled = false;
    }
  }

  asJson.addEventListener("change", () => {
    clearErrors();
    try {
      if (asJson.checked) json.value = JSON.stringify(rowsDefinition(), null, 2);
      else setRows(jsonDefinition());
    } catch (err) {
      asJson.checked = !asJson.checked; // stay where the user can fix it
      errorSlot("definition").textContent = err.message;
      return;
    }
    rows.hidden = addButton.hidden = asJson.checked;
    json.hidden = !asJson.checked;
  });

  const addButton = h("button", { type: "button", class: "small secondary", onclick: () => addRow() }, "+ key");
  addRow("ha-mode", "all");
  const el = h(
    "form",
    { class: "card policy-form", id: "policy-form", novalidate: true },
    h("h2", {}, "Add / update a policy"),
    h("p", { class: "hint" }, "Saving a policy with the name of an existing one (same vhost) updates it."),
    h(
      "div",
      { class: "form-grid" },
      field("Virtual host", vhost, "vhost"),
      field("Name", name, "name"),
      field("Pattern", pattern, "pattern", "A regular expression matched anywhere in topic names, e.g. ^ha\\."),
      field("Apply to", applyTo, "apply-to"),
      field("Priority", priority, "priority", "The highest-priority matching policy applies."),
    ),
    h(
      "div",
      { class: "field definition" },
      h("div", { class: "card-head" }, h("label", {}, "Definition"), h("label", { class: "inline" }, asJson, " edit as JSON")),
      rows,
      addButton,
      json,
      datalist,
      h("div", { class: "field-error", "data-error-for": "definition", role: "alert" }),
    ),
    general,
    h("div", { class: "form-actions" }, submit, h("button", { type: "reset", class: "secondary", onclick: () => reset() }, "Clear"), done),
  );
  el.addEventListener("submit", save);

  function reset() {
    clearErrors();
    done.hidden = true;
    setTimeout(() => setRows({ "ha-mode": "all" }));
  }

  return {
    el,
    setVhosts(names) {
      const current = vhost.value;
      const wanted = [...new Set(["/", ...names])].sort();
      if ([...vhost.options].map((o) => o.value).join("|") === wanted.join("|")) return;
      replace(vhost, wanted.map((v) => h("option", { value: v, selected: v === current }, v)));
    },
    edit(p) {
      clearErrors();
      vhost.value = p.vhost;
      name.value = p.name;
      pattern.value = p.pattern;
      applyTo.value = p["apply-to"];
      priority.value = p.priority;
      if (asJson.checked) json.value = JSON.stringify(p.definition, null, 2);
      else setRows(p.definition);
      el.scrollIntoView({ behavior: "smooth" });
      name.focus();
    },
  };
}

function fieldError(fieldName, message) {
  const err = new Error(message);
  err.field = fieldName;
  return err;
}
