// The JSON API, as the pages call it: one fetch wrapper that turns an error body
// ({error, reason, code, name, field}) into an ApiError the page can show by its field.

export class ApiError extends Error {
  constructor(status, body) {
    super(body.reason || `HTTP ${status}`);
    this.status = status;
    this.field = body.field || null;
    this.codeName = body.name || body.error || "";
  }
}

export async function api(method, path, body) {
  const init = { method, headers: { accept: "application/json" } };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const text = await resp.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { reason: text.slice(0, 200) };
  }
  if (!resp.ok) throw new ApiError(resp.status, data || { reason: resp.statusText });
  return data;
}

export const get = (path) => api("GET", path);

// RabbitMQ-shaped routes carry the vhost as a path segment ("/" is %2F).
export const seg = (name) => encodeURIComponent(name);

// RocketMQ-shaped routes take the vhost as a query (omitted for the default "/").
export const vhostQuery = (vhost) =>
  vhost && vhost !== "/" ? `vhost=${encodeURIComponent(vhost)}` : "";

// Several reads at once; a failed one is shown where its data goes, the others still render.
export async function getAll(paths) {
  const results = await Promise.allSettled(Object.values(paths).map((p) => get(p)));
  const out = {};
  Object.keys(paths).forEach((key, i) => {
    const r = results[i];
    out[key] = r.status === "fulfilled" ? { data: r.value } : { error: r.reason };
  });
  return out;
}
