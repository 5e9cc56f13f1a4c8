// The model's preprocessing in the browser: an image file -> uint8 (3, S, S), byte for byte what the Python runtime
// feeds the encoder (captioner/deploy/runtime.py `image_array`: Pillow 12's `resize((S, S), Image.BILINEAR)`).
// The resize is our own implementation of the arithmetic of Pillow's libImaging/Resample.c: separable triangle
// filter, widened by the scale factor when shrinking, coefficients normalised in double then rounded to 22-bit
// fixed point, each pass rounded and clipped to 8 bits; horizontal pass first, except for very tall pictures.

/** The largest picture (width * height) decoded, as captioner/data/image_files.py MAX_PIXELS: a bomb guard. */
export const MAX_PIXELS = 50_000_000;

const PRECISION_BITS = 22; // 32 - 8 - 2: 8 bits of result, 2 of headroom
const ONE = 2 ** PRECISION_BITS; // 1.0 in fixed point
const HALF = 2 ** (PRECISION_BITS - 1); // the rounding offset each sum starts from
const HEADER_BYTES = 256 * 1024; // how much of a file is read to find its size before decoding

/**
 * Pillow's BILINEAR resize to (size, size), channels first.
 * @param {Uint8Array|Uint8ClampedArray} rgb the picture row-major: (height, width, 3) RGB, or (height, width, 4)
 *   RGBA as a canvas's getImageData gives it (alpha ignored: composite it first); the length tells which.
 * @param {number} width @param {number} height @param {number} size the side of the square result
 * @returns {Uint8Array} (3, size, size) row-major
 */
export function resizeBilinear(rgb, width, height, size) {
  const channels = pixelStride(rgb, width, height);
  checkSide(size, "size");
  let picture = { data: rgb, width, height, channels };
  if (height > width * 100 && size < height) {
    // Pillow's Image.resize shrinks a picture over 100 times taller than wide vertically first (Pillow >= 12.2),
    // then horizontally: a different intermediate rounding, so different bytes.
    picture = resizeVertical(picture, size);
    if (size !== width) picture = resizeHorizontal(picture, size, 0, size);
  } else if (size !== width) {
    const rows = size !== height ? axisWeights(height, size) : null;
    const first = rows ? rows.start[0] : 0; // the horizontal pass resamples only the rows the vertical one reads
    const last = rows ? rows.start[size - 1] + rows.count[size - 1] : height;
    picture = resizeHorizontal(picture, size, first, last);
    if (rows) picture = resizeVertical(picture, size, rows, first);
  } else if (size !== height) {
    picture = resizeVertical(picture, size);
  }
  return channelsFirst(picture); // a copy even when the size is the picture's own, as Pillow's resize is
}

// The channel count of `rgb` for a width x height picture (3 or 4), or a TypeError.
function pixelStride(rgb, width, height) {
  checkSide(width, "width");
  checkSide(height, "height");
  if (rgb.length === width * height * 3) return 3;
  if (rgb.length === width * height * 4) return 4;
  throw new TypeError(`resizeBilinear: ${rgb.length} values is neither RGB nor RGBA of ${width}x${height}`);
}

function checkSide(value, what) {
  if (!Number.isInteger(value) || value < 1) throw new TypeError(`resizeBilinear: ${what} must be a positive integer`);
}

/**
 * One axis's filter, as Resample.c's precompute_coeffs then normalize_coeffs_8bpc compute it: output i reads
 * count[i] inputs from start[i] with the integer weights at offset[i] of `weights` (packed, no padding).
 */
function axisWeights(inSize, outSize) {
  const scale = Math.fround(inSize) / outSize; // Pillow passes the box (0, 0, W, H) as C floats
  const filterScale = Math.max(scale, 1); // the triangle widens when shrinking, never narrows
  const support = filterScale; // the bilinear filter's support is 1
  const inverse = 1 / filterScale;
  const start = new Int32Array(outSize);
  const count = new Int32Array(outSize);
  const offset = new Int32Array(outSize + 1);
  for (let i = 0; i < outSize; i++) {
    const center = (i + 0.5) * scale;
    start[i] = Math.max(Math.trunc(center - support + 0.5), 0); // C's (int) truncates
    count[i] = Math.min(Math.trunc(center + support + 0.5), inSize) - start[i];
    offset[i + 1] = offset[i] + count[i];
  }
  const weights = new Int32Array(offset[outSize]);
  const real = new Float64Array(Math.ceil(support) * 2 + 1); // one output's weights before rounding
  for (let i = 0; i < outSize; i++) {
    const center = (i + 0.5) * scale;
    let total = 0;
    for (let x = 0; x < count[i]; x++) {
      const distance = Math.abs((x + start[i] - center + 0.5) * inverse); // the same operations, in the same order
      real[x] = distance < 1 ? 1 - distance : 0;
      total += real[x];
    }
    for (let x = 0; x < count[i]; x++) {
      const w = total !== 0 ? real[x] / total : real[x];
      weights[offset[i] + x] = Math.trunc(w < 0 ? w * ONE - 0.5 : w * ONE + 0.5); // round half away from 0
    }
  }
  return { start, count, offset, weights };
}

// A fixed-point sum (started at HALF) -> a byte: Resample.c's clip8 (shift out the fraction, clamp to 0..255).
function clip8(sum) {
  const value = Math.floor(sum / ONE);
  return value < 0 ? 0 : value > 255 ? 255 : value;
}

// One output pixel of a pass: `count` input pixels from `p`, `step` apart (a row's or a column's), weighted by
// weights[first..] in fixed point, each channel clipped to a byte into out[o..o+2].
function weighSum(data, p, step, weights, first, count, out, o) {
  let r = HALF, g = HALF, b = HALF;
  for (let k = first, end = first + count; k < end; k++, p += step) {
    const w = weights[k];
    r += data[p] * w;
    g += data[p + 1] * w;
    b += data[p + 2] * w;
  }
  out[o] = clip8(r);
  out[o + 1] = clip8(g);
  out[o + 2] = clip8(b);
}

/** Resample rows [first, last) of `picture` to `outWidth` columns: (last - first, outWidth, 3) row-major. */
function resizeHorizontal(picture, outWidth, first, last) {
  const { data, width, channels } = picture;
  const { start, count, offset, weights } = axisWeights(width, outWidth);
  const out = new Uint8Array((last - first) * outWidth * 3); // (rows, outWidth, 3)
  let o = 0;
  for (let y = first; y < last; y++) {
    const row = y * width;
    for (let i = 0; i < outWidth; i++) {
      weighSum(data, (row + start[i]) * channels, channels, weights, offset[i], count[i], out, o);
      o += 3;
    }
  }
  return { data: out, width: outWidth, height: last - first, channels: 3 };
}

/**
 * Resample `picture`'s columns to `outHeight` rows: (outHeight, width, 3). `rows` (axisWeights of the original
 * height) and `first` (the original row that is picture's row 0) when a horizontal pass kept only those rows.
 */
function resizeVertical(picture, outHeight, rows = axisWeights(picture.height, outHeight), first = 0) {
  const { data, width, channels } = picture;
  const { start, count, offset, weights } = rows;
  const out = new Uint8Array(outHeight * width * 3); // (outHeight, width, 3)
  const rowStep = width * channels;
  let o = 0;
  for (let i = 0; i < outHeight; i++) {
    const top = (start[i] - first) * rowStep;
    for (let x = 0; x < width; x++) {
      weighSum(data, top + x * channels, rowStep, weights, offset[i], count[i], out, o);
      o += 3;
    }
  }
  return { data: out, width, height: outHeight, channels: 3 };
}

// (H, W, C) -> (3, H, W): the encoder's layout; alpha, if any, dropped.
function channelsFirst({ data, width, height, channels }) {
  const plane = width * height;
  const out = new Uint8Array(3 * plane); // (3, H, W) row-major
  for (let i = 0, p = 0; i < plane; i++, p += channels) {
    out[i] = data[p];
    out[plane + i] = data[p + 1];
    out[2 * plane + i] = data[p + 2];
  }
  return out;
}

/**
 * Refuse a picture over MAX_PIXELS with one line, as the Python `load_image` does.
 * @param {number} width @param {number} height @param {string} name the file's name, for the message
 */
export function checkPixels(width, height, name) {
  if (width * height > MAX_PIXELS) {
    throw new Error(`${name}: image is ${width}x${height} = ${(width * height / 1e6).toFixed(0)} megapixels, `
      + `over the limit of ${(MAX_PIXELS / 1e6).toFixed(0)} (possible decompression bomb)`);
  }
}

/**
 * A file's first frame, upright by its EXIF orientation, no colour-space conversion, transparency over white.
 * Browser-only (createImageBitmap, OffscreenCanvas); works in a module Web Worker.
 * @param {Blob} blob @param {string} [name] the file's name for messages (a File's own name by default)
 * @returns {Promise<{rgb: Uint8ClampedArray, width: number, height: number}>} rgb: (height, width, 4) RGBA
 *   row-major as getImageData gives it, alpha 255 everywhere (resizeBilinear takes it as it is)
 */
export async function decodePicture(blob, name = blob.name || "the file") {
  if (blob.size === 0) throw new Error(`${name}: empty file (0 bytes)`);
  const known = headerSize(new Uint8Array(await blob.slice(0, HEADER_BYTES).arrayBuffer()));
  if (known) checkPixels(known.width, known.height, name); // before the decoder allocates it
  let bitmap;
  try {
    bitmap = await createImageBitmap(blob, {
      imageOrientation: "from-image", colorSpaceConversion: "none", premultiplyAlpha: "none",
    });
  } catch {
    throw new Error(`not an image the browser can decode: ${name}`);
  }
  try {
    const { width, height } = bitmap;
    checkPixels(width, height, name);
    const context = new OffscreenCanvas(width, height).getContext("2d", { willReadFrequently: true });
    context.fillStyle = "#ffffff";
    context.fillRect(0, 0, width, height);
    context.drawImage(bitmap, 0, 0);
    const rgb = context.getImageData(0, 0, width, height).data; // (height, width, 4) row-major
    if (rgb[3] !== 255 || rgb[rgb.length - 1] !== 255) { // a canvas over the browser's limits stays blank
      throw new Error(`${name}: image is ${width}x${height} pixels, more than this browser's canvas can hold`);
    }
    return { rgb, width, height };
  } finally {
    bitmap.close();
  }
}

/**
 * An image file -> uint8 (3, size, size), the encoder's input: decodePicture then resizeBilinear.
 * @param {Blob} blob @param {number} size @param {string} [name] @returns {Promise<Uint8Array>}
 */
export async function preprocess(blob, size, name = blob.name || "the file") {
  const { rgb, width, height } = await decodePicture(blob, name);
  return resizeBilinear(rgb, width, height, size);
}

/**
 * The stored size of a PNG, GIF, BMP, WebP or JPEG from its first bytes, or null (another format, or the
 * JPEG's frame header lies further in): enough to refuse a decompression bomb before decoding it.
 * @param {Uint8Array} bytes @returns {{width: number, height: number} | null}
 */
export function headerSize(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const ascii = (at, length) => String.fromCharCode(...bytes.subarray(at, at + length));
  if (bytes.length >= 24 && ascii(1, 3) === "PNG" && ascii(12, 4) === "IHDR") {
    return { width: view.getUint32(16), height: view.getUint32(20) };
  }
  if (bytes.length >= 10 && ascii(0, 3) === "GIF") {
    return { width: view.getUint16(6, true), height: view.getUint16(8, true) };
  }
  if (bytes.length >= 26 && ascii(0, 2) === "BM") {
    if (view.getUint32(14, true) === 12) return { width: view.getUint16(18, true), height: view.getUint16(20, true) };
    return { width: Math.abs(view.getInt32(18, true)), height: Math.abs(view.getInt32(22, true)) };
  }
  if (bytes.length >= 30 && ascii(0, 4) === "RIFF" && ascii(8, 4) === "WEBP") return webpSize(bytes, view, ascii);
  if (bytes.length >= 4 && bytes[0] === 0xff && bytes[1] === 0xd8) return jpegSize(bytes, view);
  return null;
}

// A WebP's canvas size from its first chunk (VP8X, VP8L or VP8), or null.
function webpSize(bytes, view, ascii) {
  const chunk = ascii(12, 4);
  const u24 = (at) => bytes[at] | (bytes[at + 1] << 8) | (bytes[at + 2] << 16);
  if (chunk === "VP8X") return { width: u24(24) + 1, height: u24(27) + 1 };
  if (chunk === "VP8L") {
    const bits = view.getUint32(21, true);
    return { width: (bits & 0x3fff) + 1, height: ((bits >>> 14) & 0x3fff) + 1 };
  }
  if (chunk === "VP8 ") return { width: view.getUint16(26, true) & 0x3fff, height: view.getUint16(28, true) & 0x3fff };
  return null;
}

// A JPEG's frame size from its SOFn segment, walking the segments from the start, or null if not in `bytes`.
function jpegSize(bytes, view) {
  let at = 2;
  while (at + 9 <= bytes.length) {
    if (bytes[at] !== 0xff) return null;
    const marker = bytes[at + 1];
    if (marker === 0xff) { at += 1; continue; } // fill byte
    if (marker === 0xd8 || marker === 0x01 || (marker >= 0xd0 && marker <= 0xd7)) { at += 2; continue; }
    const isFrame = marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc;
    if (isFrame) return { width: view.getUint16(at + 7), height: view.getUint16(at + 5) };
    at += 2 + view.getUint16(at + 2);
  }
  return null;
}
