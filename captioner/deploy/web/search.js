// Greedy decoding and batched beam search over an asynchronous decoder step: captioner/deploy/numpy_search.py line
// for line (the same rules, stopping rule, ranking, ties and float32 sums), so that the page and the Python runtime
// find the same captions from the same step numbers. Tensors are plain {type, data, dims} (as ort.Tensor): no
// onnxruntime here; the step (an onnxruntime-web session in the page) is the caller's.

/**
 * @typedef {{type: string, data: ArrayLike<any>, dims: number[]}} Tensor  data: any TypedArray (BigInt64Array too)
 * @typedef {Object<string, Tensor>} Tensors  a memory or a state: name -> batch-first tensor
 * @typedef {{bos: number, eos: number, banned: Uint8Array, badEndings: Uint8Array}} TokenRules  (V,) masks
 * @typedef {{beamSize: number, maxLength: number, lengthPenalty: number, blockTrigrams: boolean, minLength: number,
 *   suppressBadEndings: boolean}} SearchOptions
 * @typedef {{logprobs: Float32Array, attn: Float32Array, attnDims: number[], state: Tensors}} StepOutput
 *   logprobs (R, V), attn (R, L, H, N) with attnDims [L, H, N], the next state
 * @typedef {(memory: Tensors, prevTokens: Int32Array, state: Tensors) => Promise<StepOutput>} StepFunction
 * @typedef {{tokens: number[], score: number, logprob: number, attn: Float32Array, attnDims: number[],
 *   finished: boolean}} Hypothesis  tokens without <bos> and <eos>; attn (T, L, H, N) with attnDims [T, L, H, N]
 */

const NEG_INF = -Infinity;

/** GNMT's ((5 + length) / 6) ** alpha; alpha = 0 ranks by total log-probability. */
export function lengthPenalty(length, alpha) {
  return ((5.0 + length) / 6.0) ** alpha;
}

/**
 * logprobs (R, V) with -inf at the banned ids, and at <eos> before `minLength` words or after a bad ending
 * (`suppressBadEndings`): a new Float32Array. history: R arrays of the t words so far.
 * @param {Float32Array} logprobs @param {number[][]} history @param {TokenRules} rules @param {SearchOptions} options
 */
export function applyRules(logprobs, history, rules, options) {
  const V = rules.banned.length;
  const out = Float32Array.from(logprobs); // (R, V) row-major
  for (let i = 0; i < out.length; i++) if (rules.banned[i % V]) out[i] = NEG_INF;
  const t = words(history);
  if (t < options.minLength) {
    for (let r = 0; r < history.length; r++) out[r * V + rules.eos] = NEG_INF;
  } else if (options.suppressBadEndings && t > 0) {
    for (let r = 0; r < history.length; r++) if (rules.badEndings[history[r][t - 1]]) out[r * V + rules.eos] = NEG_INF;
  }
  return out;
}

/**
 * -inf at every word w that would repeat a trigram (a, b, w) of its row: a copy of logprobs (R, V), or logprobs
 * itself when the rows have fewer than 3 words. history: R arrays of t words.
 */
export function blockRepeatedTrigrams(logprobs, history) {
  const t = words(history);
  if (t < 3) return logprobs;
  const V = logprobs.length / history.length;
  const blocked = Float32Array.from(logprobs); // (R, V)
  history.forEach((row, r) => {
    for (let i = 0; i + 2 < t; i++) {
      if (row[i] === row[t - 2] && row[i + 1] === row[t - 1]) blocked[r * V + row[i + 2]] = NEG_INF;
    }
  });
  return blocked;
}

/**
 * Column indices of each row's k largest values, largest (then lower index) first: values (R, M) row-major ->
 * Int32Array (R, min(k, M)). A partial selection: one pass over each row, keeping its best k in order.
 * @param {ArrayLike<number>} values @param {number} columns M @param {number} k
 */
export function topDescending(values, columns, k) {
  k = Math.min(k, columns);
  const rows = values.length / columns;
  const top = new Int32Array(rows * k); // (R, k)
  const kept = new Float64Array(k); // the row's best values so far, largest first
  for (let r = 0; r < rows; r++) {
    const base = r * columns;
    const index = top.subarray(r * k, (r + 1) * k);
    let count = 0;
    for (let j = 0; j < columns; j++) {
      const value = values[base + j];
      if (count === k && !(value > kept[k - 1])) continue; // an equal value came first: it stays ahead
      let at = count < k ? count++ : k - 1;
      for (; at > 0 && kept[at - 1] < value; at--) {
        kept[at] = kept[at - 1];
        index[at] = index[at - 1];
      }
      kept[at] = value;
      index[at] = j;
    }
  }
  return top;
}

/**
 * np.take(tensor, rows, axis=0): a new tensor of the given rows, in order, its data of the same type.
 * @param {Tensor} tensor @param {ArrayLike<number>} rows @returns {Tensor}
 */
export function takeRows(tensor, rows) {
  const [count, ...rest] = tensor.dims;
  const size = rest.reduce((a, b) => a * b, 1);
  const source = tensor.data;
  const data = new source.constructor(rows.length * size);
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i];
    if (!(row >= 0 && row < count)) throw new RangeError(`row ${row} is out of the tensor's ${count} rows`);
    if (ArrayBuffer.isView(source)) data.set(source.subarray(row * size, (row + 1) * size), i * size);
    else for (let j = 0; j < size; j++) data[i * size + j] = source[row * size + j];
  }
  return { type: tensor.type, data, dims: [rows.length, ...rest] };
}

/** np.repeat(tensor, times, axis=0): each row `times` times, consecutively. @returns {Tensor} */
export function repeatRows(tensor, times) {
  const rows = Int32Array.from({ length: tensor.dims[0] * times }, (_, i) => Math.floor(i / times));
  return takeRows(tensor, rows);
}

/**
 * Per image its `nBest` hypotheses, best first: greedy when the beam is 1, else beam search.
 * @param {StepFunction} step @param {Tensors} memory @param {Tensors} state @param {TokenRules} rules
 * @param {SearchOptions} options @param {number} nBest @returns {Promise<Hypothesis[][]>}
 */
export async function decodeHypotheses(step, memory, state, rules, options, nBest = 1) {
  if (options.beamSize <= 1) return (await greedySearch(step, memory, state, rules, options)).map((h) => [h]);
  return beamSearchNBest(step, memory, state, rules, options, nBest);
}

/**
 * The most probable allowed word at each step for every row, until all ended or maxLength; the score is the
 * log-probability of the words and the <eos>. @returns {Promise<Hypothesis[]>}
 */
export async function greedySearch(step, memory, state, rules, options) {
  const batch = firstTensor(memory).dims[0];
  let prev = new Int32Array(batch).fill(rules.bos); // (B,)
  const logprob = new Float32Array(batch); // (B,): float32 sums, as numpy's
  let history = Array.from({ length: batch }, () => []); // (B, t)
  const done = new Uint8Array(batch); // (B,)
  const maps = []; // per step (B, L, H, N)
  let mapDims = [];
  for (let t = 0; t < options.maxLength; t++) {
    const out = await step(memory, prev, state); // (B, V), (B, L, H, N)
    state = out.state;
    const logprobs = applyRules(out.logprobs, history, rules, options); // (B, V)
    const allowed = options.blockTrigrams ? blockRepeatedTrigrams(logprobs, history) : logprobs; // (B, V)
    const V = logprobs.length / batch;
    prev = argmaxRows(allowed, V); // (B,)
    for (let b = 0; b < batch; b++) logprob[b] += done[b] ? 0 : logprobs[b * V + prev[b]];
    history = history.map((row, b) => [...row, prev[b]]); // (B, t+1)
    maps.push(Float32Array.from(out.attn));
    mapDims = out.attnDims;
    for (let b = 0; b < batch; b++) if (prev[b] === rules.eos) done[b] = 1;
    if (done.every(Boolean)) break;
  }
  const size = mapDims.reduce((a, b) => a * b, 1); // L*H*N
  return history.map((row, b) => {
    const n = done[b] ? row.indexOf(rules.eos) : options.maxLength; // words before <eos>
    const attn = new Float32Array(n * size); // (n, L, H, N)
    for (let s = 0; s < n; s++) attn.set(maps[s].subarray(b * size, (b + 1) * size), s * size);
    return hypothesis(row.slice(0, n), logprob[b], logprob[b], attn, [n, ...mapDims], Boolean(done[b]));
  });
}

/**
 * Each step's attention maps and back-pointers: a beam's maps are read back once, when it becomes a hypothesis,
 * not copied at every reordering.
 */
export class BeamHistory {
  constructor() {
    this.maps = []; // per step (R, L, H, N), rows as after that step's reordering
    this.parents = []; // per step (R,): the row each beam came from
  }

  /** attn (R', L, H, N) of the step, rows (R,): each beam's parent row among the R'. */
  append(attn, rows, mapDims) {
    const size = mapDims.reduce((a, b) => a * b, 1);
    const maps = attn instanceof Float32Array ? attn : Float32Array.from(attn); // as numpy's astype(float32)
    this.maps.push(takeRows({ type: "float32", data: maps, dims: [maps.length / size, size] }, rows).data);
    this.parents.push(rows);
  }

  /** (t, L, H, N) with dims [t, L, H, N]: the maps of the beam in `row` after the last step, first word first. */
  attention(row, mapDims) {
    const size = mapDims.reduce((a, b) => a * b, 1);
    const steps = this.maps.length;
    const attn = new Float32Array(steps * size);
    for (let step = steps - 1; step >= 0; step--) {
      attn.set(this.maps[step].subarray(row * size, (row + 1) * size), step * size);
      row = this.parents[step][row];
    }
    return { attn, attnDims: [steps, ...mapDims] };
  }
}

/** The best hypothesis of each image's `beamSearchNBest`. @returns {Promise<Hypothesis[]>} */
export async function beamSearch(step, memory, state, rules, options) {
  return (await beamSearchNBest(step, memory, state, rules, options, 1)).map((ranked) => ranked[0]);
}

/**
 * Per image its `nBest` (<= beamSize) best distinct hypotheses, best first. Each step keeps each image's top 2K of
 * K*V continuations: an <eos> in the top K finishes, the best K others stay live; an image is done once no live beam
 * can beat K finished ones (torch's rule). @returns {Promise<Hypothesis[][]>}
 */
export async function beamSearchNBest(step, memory, state, rules, options, nBest = 1) {
  checkSearch(options.beamSize, nBest);
  const B = firstTensor(memory).dims[0];
  const [K, maxLength, alpha, eos] = [options.beamSize, options.maxLength, options.lengthPenalty, rules.eos];
  memory = mapTensors(memory, (v) => repeatRows(v, K)); // (B*K, ...): image b's beams: rows b*K..b*K+K-1
  state = mapTensors(state, (v) => repeatRows(v, K)); // (B*K, ...)
  let prev = new Int32Array(B * K).fill(rules.bos); // (B*K,)
  let scores = new Float32Array(B * K).fill(NEG_INF); // (B, K)
  for (let b = 0; b < B; b++) scores[b * K] = 0.0; // all beams start identical: expand only the first
  let history = Array.from({ length: B * K }, () => []); // (B*K, t)
  const beams = new BeamHistory();
  const finished = Array.from({ length: B }, () => []);
  const done = new Array(B).fill(false);
  const bestPossiblePenalty = lengthPenalty(maxLength, alpha);
  let mapDims = [];

  for (let t = 0; t < maxLength; t++) {
    const out = await step(memory, prev, state); // (B*K, V), (B*K, L, H, N)
    state = out.state;
    mapDims = out.attnDims;
    let logprobs = applyRules(out.logprobs, history, rules, options); // (B*K, V)
    if (options.blockTrigrams) logprobs = blockRepeatedTrigrams(logprobs, history);
    const V = logprobs.length / (B * K);
    const candidates = addRowScores(scores, logprobs); // (B, K*V): true log-probabilities, float32
    const top = selectTop(candidates, K * V, 2 * K, V, eos); // (B, 2K) each

    // Finished hypotheses: <eos> within the top K of a search still going on.
    for (let b = 0; b < B; b++) {
      for (let j = 0; j < Math.min(K, top.k); j++) {
        const at = b * top.k + j;
        if (!top.isEos[at] || !Number.isFinite(top.scores[at]) || done[b]) continue;
        const row = b * K + top.beam[at];
        const raw = top.scores[at];
        const { attn, attnDims } = beams.attention(row, mapDims); // (t, L, H, N)
        finished[b].push(hypothesis(history[row].slice(), raw / lengthPenalty(t, alpha), raw, attn, attnDims, true));
      }
    }

    // Live beams: the best K candidates of each image that do not end here.
    const notEnding = top.scores.map((s, i) => (top.isEos[i] ? NEG_INF : s)); // (B, 2K)
    const livePos = topDescending(notEnding, top.k, K); // (B, K)
    const rows = new Int32Array(B * K); // (B*K,)
    const liveToken = new Int32Array(B * K); // (B*K,)
    scores = new Float32Array(B * K); // (B, K): -inf where none is left
    livePos.forEach((pos, i) => {
      const at = Math.floor(i / K) * top.k + pos;
      rows[i] = Math.floor(i / K) * K + top.beam[at];
      liveToken[i] = top.token[at];
      scores[i] = notEnding[at];
    });
    state = mapTensors(state, (v) => takeRows(v, rows));
    history = Array.from(rows, (row, i) => [...history[row], liveToken[i]]); // (B*K, t+1)
    beams.append(out.attn, rows, mapDims);
    prev = liveToken; // (B*K,)

    for (let b = 0; b < B; b++) {
      if (done[b] || finished[b].length < K) continue;
      const worst = finished[b].map((h) => h.score).sort((x, y) => x - y)[finished[b].length - K];
      done[b] = worst >= Math.max(...scores.subarray(b * K, (b + 1) * K)) / bestPossiblePenalty;
    }
    if (done.every(Boolean)) break;
  }

  return bestHypotheses(finished, done, scores, history, beams, mapDims, alpha, nBest);
}

/**
 * Per image its `nBest` best distinct hypotheses: the finished ones and, for an image cut off at maxLength, its live
 * beams (scores (B, K), history (B*K, t)) on the same penalised score. @returns {Hypothesis[][]}
 */
export function bestHypotheses(finished, done, scores, history, beams, mapDims, alpha, nBest) {
  const B = finished.length;
  const K = scores.length / B;
  const livePenalty = lengthPenalty(words(history), alpha);
  return finished.map((ended, b) => {
    const pool = [...ended];
    if (!done[b]) {
      for (let row = b * K; row < (b + 1) * K; row++) {
        const raw = scores[row];
        if (raw === NEG_INF) continue;
        const { attn, attnDims } = beams.attention(row, mapDims); // (t, L, H, N)
        pool.push(hypothesis(history[row].slice(), raw / livePenalty, raw, attn, attnDims, false));
      }
    }
    const ranked = new Map(); // each caption once, at its best: a stable sort, best first
    for (const hyp of pool.sort((x, y) => (x.score > y.score ? -1 : x.score < y.score ? 1 : 0))) {
      if (!ranked.has(hyp.tokens.join(","))) ranked.set(hyp.tokens.join(","), hyp);
    }
    return [...ranked.values()].slice(0, nBest);
  });
}

/** The search's refusal (core/decode_schema.py `search_problem`), in the words of Python's ConfigError. */
export function checkSearch(beamSize, nBest) {
  if (nBest > beamSize) {
    const problem = `n_best (${nBest}) must not exceed beam_size (${beamSize}); raise the beam or sample`;
    const error = new Error(`decode: ${problem}`);
    error.name = "ConfigError";
    throw error;
  }
}

// The first tensor of a memory or state (numpy_search's next(iter(memory.values()))).
function firstTensor(tensors) {
  return Object.values(tensors)[0];
}

// A memory or state with `change` applied to each tensor: a new object.
function mapTensors(tensors, change) {
  return Object.fromEntries(Object.entries(tensors).map(([name, tensor]) => [name, change(tensor)]));
}

// The words each row of a history has so far (numpy's history.shape[1]).
function words(history) {
  return history.length ? history[0].length : 0;
}

// Each row's first largest column (numpy's argmax): values (R, V) -> Int32Array (R,).
function argmaxRows(values, V) {
  const best = new Int32Array(values.length / V);
  for (let r = 0; r < best.length; r++) {
    for (let v = 1; v < V; v++) if (values[r * V + v] > values[r * V + best[r]]) best[r] = v;
  }
  return best;
}

// scores (R,) + logprobs (R, V) in float32, as numpy adds float32 arrays: (R, V), that is (B, K*V).
function addRowScores(scores, logprobs) {
  const V = logprobs.length / scores.length;
  const sums = new Float32Array(logprobs.length);
  for (let i = 0; i < sums.length; i++) sums[i] = scores[Math.floor(i / V)] + logprobs[i];
  return sums;
}

// Each image's top 2K candidates (B, K*V): their score (float32), beam, word and whether it is <eos>; k: 2K or less.
function selectTop(candidates, columns, count, V, eos) {
  const index = topDescending(candidates, columns, count); // (B, k)
  const k = Math.min(count, columns);
  const rowOf = (i) => Math.floor(i / k) * columns;
  const token = index.map((c) => c % V);
  return {
    k, token,
    scores: Float32Array.from(index, (c, i) => candidates[rowOf(i) + c]),
    beam: index.map((c) => Math.floor(c / V)),
    isEos: Uint8Array.from(token, (w) => (w === eos ? 1 : 0)),
  };
}

function hypothesis(tokens, score, logprob, attn, attnDims, finished) {
  return { tokens, score, logprob, attn, attnDims, finished };
}
