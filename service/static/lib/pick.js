// @ts-check
// A response's arrays as a cell's explanation reads them, a leaf: one array for the clicked
// cell's head and batch item (`pick`), and the service's JSON numbers (null is −∞).

export const NEG_INF = -Infinity;

/** A JSON number; null (the service's -inf) becomes -Infinity. */
export function num(x) {
  return x === null || x === undefined ? NEG_INF : Number(x);
}

function depth(a) {
  let d = 0;
  while (Array.isArray(a)) {
    d += 1;
    a = a[0];
  }
  return d;
}

/** ctx's array `key` for its head and batch item, reduced to `want` dimensions. */
export function pick(ctx, key, want = 2) {
  const { data, head, batch } = ctx;
  let a;
  let fromHead = false;
  if (
    head !== null &&
    head !== undefined &&
    data.heads &&
    data.heads[head] &&
    key in data.heads[head]
  ) {
    a = data.heads[head][key];
    fromHead = true;
  } else {
    a = data[key];
  }
  if (a === undefined || a === null) return undefined;
  if (!Array.isArray(a)) return a;
  if (depth(a) > want && batch !== null && batch !== undefined) a = a[batch];
  if (!fromHead && depth(a) > want && head !== null && head !== undefined) a = a[head];
  const kv = ctx.kv; // a top-level array kept per key/value head ([h_kv][rows][·])
  if (depth(a) > want && kv !== null && kv !== undefined) a = a[kv];
  return a;
}

/** ctx with its request as the service read it: the fields a Hugging Face config gave
 * (conventions.config_fields: the rope, clip_qkv, the mask … a config implies), which the
 * request's own fields did not (a mask is the two combined). Explanations read this. */
export function asRead(ctx) {
  const fields = ctx.data?.conventions?.config_fields;
  if (!fields || ctx.read) return ctx;
  return { ...ctx, request: { ...ctx.request, ...fields }, read: true };
}
