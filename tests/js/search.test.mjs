// The page's search (captioner/deploy/web/search.js) on every case of tests/data/search_cases.json, the cases that
// the torch and numpy searches pass too (tests/test_search_conformance.py): the same words and endings, scores and
// log-probabilities to 1e-5, maps to 1e-6; the refusal in the Python words; row gathers of int64 tensors.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  beamSearchNBest, decodeHypotheses, repeatRows, takeRows, topDescending,
} from "../../captioner/deploy/web/search.js";

const FIXTURE = JSON.parse(readFileSync(new URL("../data/search_cases.json", import.meta.url), "utf8"));
const V = FIXTURE.words.length;
const TABLES = Object.fromEntries(Object.entries(FIXTURE.tables).map(([name, t]) => [name, {
  ...t, logprobs: float32s(t.logprobs), attn: float32s(t.attn), // (B, T, V, V), (B, V, N)
}]));

// base64 of little-endian float32 -> Float32Array.
function float32s(text) {
  const bytes = Buffer.from(text, "base64");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
  return Float32Array.from({ length: bytes.length / 4 }, (_, i) => view.getFloat32(4 * i, true));
}

function int64(values) {
  return { type: "int64", data: BigInt64Array.from(values, (v) => BigInt(v)), dims: [values.length] };
}

// The tables' decoder step: memory {image}, state {steps, image}, int64 (R,) each, the state gathered by the search.
function lookupStep(tables) {
  const { steps: T, cells: N } = tables;
  return async (memory, prevTokens, state) => {
    const R = prevTokens.length;
    assert.deepEqual(state.image.data, memory.image.data, "the state's rows left their image");
    const logprobs = new Float32Array(R * V); // (R, V)
    const attn = new Float32Array(R * N); // (R, 1, 1, N)
    for (let r = 0; r < R; r++) {
      const [b, t, prev] = [Number(memory.image.data[r]), Number(state.steps.data[r]), prevTokens[r]];
      assert.ok(t < T, `step ${t} is past the tables' ${T}`);
      const at = ((b * T + t) * V + prev) * V;
      logprobs.set(tables.logprobs.subarray(at, at + V), r * V);
      attn.set(tables.attn.subarray((b * V + prev) * N, (b * V + prev + 1) * N), r * N);
    }
    const steps = { type: "int64", data: state.steps.data.map((s) => s + 1n), dims: [R] };
    return { logprobs, attn, attnDims: [1, 1, N], state: { steps, image: state.image } };
  };
}

// A case's search over `images` of its tables (all by default), as search.js is called in the page; `calls`
// gets one element per step.
function run(spec, images = null, calls = []) {
  const tables = TABLES[spec.tables];
  images ??= Array.from({ length: tables.images }, (_, b) => b);
  const mask = (ids) => Uint8Array.from({ length: V }, (_, w) => (ids.includes(w) ? 1 : 0));
  const rules = { bos: spec.bos, eos: spec.eos, banned: mask(spec.banned), badEndings: mask(spec.bad_endings) };
  const o = spec.options;
  const options = {
    beamSize: o.beam_size, maxLength: o.max_length, lengthPenalty: o.length_penalty, blockTrigrams: o.block_trigrams,
    minLength: o.min_length, suppressBadEndings: o.suppress_bad_endings,
  };
  const memory = { image: int64(images) };
  const state = { steps: int64(images.map(() => 0)), image: int64(images) };
  const search = spec.search === "beam" ? beamSearchNBest : decodeHypotheses;
  const step = lookupStep(tables);
  const counted = (...args) => calls.push(1) && step(...args);
  return search(counted, memory, state, rules, options, spec.n_best);
}

function assertClose(got, want, tolerance, what) {
  assert.ok(Math.abs(got - want) <= tolerance, `${what}: ${got} is not ${want} within ${tolerance}`);
}

// got: per image its hypotheses; expected: the fixture's. Beyond the Python suite's tolerances, the log-probabilities
// and maps are the very float32 values (sums in float32 as numpy's); scores differ at most by pow's last bit.
function assertSameHypotheses(got, expected, cells, where) {
  assert.equal(got.length, expected.length, `${where}: images`);
  expected.forEach((want, b) => {
    const at = `${where}, image ${b}`;
    assert.deepEqual(got[b].map((h) => [h.tokens, h.finished]), want.map((h) => [h.tokens, h.finished]), at);
    want.forEach((w, i) => {
      const h = got[b][i];
      assertClose(h.score, w.score, 1e-5, `${at}, hypothesis ${i} score`);
      assertClose(h.logprob, w.logprob, 1e-5, `${at}, hypothesis ${i} logprob`);
      assert.equal(h.logprob, Math.fround(w.logprob), `${at}, hypothesis ${i}: the float32 sum`);
      assert.deepEqual(h.attnDims, [w.tokens.length, 1, 1, cells], `${at}, hypothesis ${i} maps' dims`);
      assert.equal(h.attn.length, w.attn.length, `${at}, hypothesis ${i} maps`);
      h.attn.forEach((x, j) => assertClose(x, w.attn[j], 1e-6, `${at}, hypothesis ${i} map value ${j}`));
      assert.deepEqual(h.attn, Float32Array.from(w.attn), `${at}, hypothesis ${i}: the maps' very values`);
    });
  });
}

for (const spec of FIXTURE.cases) {
  test(`case ${spec.name}`, async () => {
    const cells = TABLES[spec.tables].cells;
    const calls = [];
    assertSameHypotheses(await run(spec, null, calls), spec.expected, cells, spec.name);
    assert.equal(calls.length, spec.steps, "steps run (the stopping rule)");
    if (!spec.alone) return;
    for (let b = 0; b < spec.expected.length; b++) { // each image alone finds what it finds in the batch
      assertSameHypotheses(await run(spec, [b]), [spec.expected[b]], cells, `${spec.name} (image ${b} alone)`);
    }
  });
}

test("the fixture covers every rule", () => {
  const names = FIXTURE.cases.map((c) => c.name.split("/")[0]);
  for (const rule of ["greedy", "n_best", "length_penalty", "trigrams", "banned", "min_length", "first_word", "endless",
    "batch", "agree", "ties"]) assert.ok(names.includes(rule), rule);
  assert.ok(FIXTURE.refusals.length > 0);
});

test("more hypotheses than beams: refused in the words of the Python search", async () => {
  for (const spec of FIXTURE.refusals) {
    await assert.rejects(run(spec), (error) => {
      assert.equal(error.message, spec.error);
      assert.equal(error.message, "decode: n_best (3) must not exceed beam_size (2); raise the beam or sample");
      return true;
    });
  }
});

test("rows of an int64 (BigInt64Array) tensor are gathered and repeated into new tensors", () => {
  const tensor = { type: "int64", data: BigInt64Array.from([10n, 11n, 20n, 21n, 30n, 31n]), dims: [3, 2] };
  const taken = takeRows(tensor, Int32Array.from([2, 0, 2]));
  assert.ok(taken.data instanceof BigInt64Array);
  assert.deepEqual(taken, { type: "int64", data: BigInt64Array.from([30n, 31n, 10n, 11n, 30n, 31n]), dims: [3, 2] });
  const repeated = repeatRows(tensor, 2);
  assert.deepEqual([...repeated.data], [10n, 11n, 10n, 11n, 20n, 21n, 20n, 21n, 30n, 31n, 30n, 31n]);
  assert.deepEqual(repeated.dims, [6, 2]);
  assert.deepEqual([...tensor.data], [10n, 11n, 20n, 21n, 30n, 31n], "the source is left as it was");
  assert.throws(() => takeRows(tensor, [3]), RangeError);
  const scalars = takeRows({ type: "int64", data: BigInt64Array.from([7n, 8n]), dims: [2] }, [1, 1, 0]);
  assert.deepEqual(scalars, { type: "int64", data: BigInt64Array.from([8n, 8n, 7n]), dims: [3] });
});

test("topDescending: largest first, the lower index first among equal values, at the k-th boundary too", () => {
  // numpy's top_descending([[0, 0, 1, 1]], 1) gives [[3]] (argpartition's pick among ties); the rule is [[2]].
  assert.deepEqual([...topDescending([0, 0, 1, 1], 4, 1)], [2]);
  assert.deepEqual([...topDescending([-1, -1, -1, -1, 0, 0], 6, 5)], [4, 5, 0, 1, 2]);
  assert.deepEqual([...topDescending([-Infinity, 2, -Infinity, 2, 5, -Infinity], 3, 3)], [1, 0, 2, 1, 0, 2]);
  let seed = 1;
  const random = () => (seed = (seed * 48271) % 2147483647) % 4; // few distinct values: many ties
  for (let trial = 0; trial < 200; trial++) {
    const columns = 1 + (trial % 23);
    const values = Float32Array.from({ length: 3 * columns }, () => random() - 2);
    const k = 1 + (trial % 7);
    const top = topDescending(values, columns, k);
    for (let r = 0; r < 3; r++) {
      const order = Array.from({ length: columns }, (_, j) => j)
        .sort((a, b) => values[r * columns + b] - values[r * columns + a] || a - b);
      const kk = Math.min(k, columns);
      assert.deepEqual([...top.subarray(r * kk, (r + 1) * kk)], order.slice(0, kk), `trial ${trial}, row ${r}`);
    }
  }
});
