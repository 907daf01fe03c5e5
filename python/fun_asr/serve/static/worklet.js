// fun-asr web page: the microphone's AudioWorkletProcessor ("pcm16k"). It takes the first input channel at the
// AudioContext's rate, resamples it to 16 kHz (a windowed-sinc low-pass below the new Nyquist, evaluated at each
// output sample's fractional position from a table of phases) and converts it to little-endian int16 PCM, the
// realtime WebSocket's format. Every `chunk` output samples (100 ms) it posts {pcm: ArrayBuffer, peak, rms}; the
// message "flush" posts what is left (then {flushed: true}), "stop" ends the processor.
"use strict";

const OUT_RATE = 16000;
const PHASES = 256;

class Pcm16k extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const inRate = sampleRate; // the AudioWorkletGlobalScope's rate: the context's
    this.step = inRate / OUT_RATE; // input samples per output sample
    const down = Math.max(1, this.step);
    const fc = 0.45 / down; // cutoff in cycles per input sample: 7.2 kHz for any input rate above 16 kHz
    this.half = Math.ceil(8 * down); // taps on each side
    const taps = 2 * this.half;
    this.table = new Float32Array(PHASES * taps);
    for (let p = 0; p < PHASES; p++) {
      let sum = 0;
      for (let j = 0; j < taps; j++) {
        const d = p / PHASES + this.half - 1 - j; // distance from the output position to tap j
        const x = 2 * fc * d;
        const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
        const w = 0.5 + 0.5 * Math.cos(Math.PI * d / this.half); // Hann window over +-half
        const h = Math.abs(d) >= this.half ? 0 : sinc * w;
        this.table[p * taps + j] = h;
        sum += h;
      }
      for (let j = 0; j < taps; j++) this.table[p * taps + j] /= sum; // unit gain at DC
    }
    this.buf = new Float32Array(Math.max(4096, 4 * taps));
    this.len = this.half; // history starts with `half` zeros
    this.pos = this.half - 1; // the next output sample's position in `buf`, in input samples
    this.chunk = (options && options.processorOptions && options.processorOptions.chunk) || 1600;
    this.out = new Int16Array(this.chunk);
    this.n = 0;
    this.peak = 0;
    this.sq = 0;
    this.count = 0;
    this.running = true;
    this.port.onmessage = (e) => {
      if (e.data === "flush") {
        this.post();
        this.port.postMessage({ flushed: true });
      } else if (e.data === "stop") {
        this.running = false;
      }
    };
  }

  post() {
    if (this.n > 0) {
      const pcm = this.out.slice(0, this.n).buffer;
      const rms = this.count ? Math.sqrt(this.sq / this.count) : 0;
      this.port.postMessage({ pcm, peak: this.peak, rms }, [pcm]);
    }
    this.n = 0;
    this.peak = 0;
    this.sq = 0;
    this.count = 0;
  }

  push(block) {
    if (this.len + block.length > this.buf.length) { // drop what no output needs any more
      const keep = Math.floor(this.pos) - this.half + 1;
      this.buf.copyWithin(0, keep, this.len);
      this.len -= keep;
      this.pos -= keep;
      if (this.len + block.length > this.buf.length) {
        const bigger = new Float32Array(2 * (this.len + block.length));
        bigger.set(this.buf.subarray(0, this.len));
        this.buf = bigger;
      }
    }
    this.buf.set(block, this.len);
    this.len += block.length;
    for (let i = 0; i < block.length; i++) {
      const a = Math.abs(block[i]);
      if (a > this.peak) this.peak = a;
      this.sq += block[i] * block[i];
    }
    this.count += block.length;
  }

  resample() {
    const taps = 2 * this.half;
    while (Math.floor(this.pos) + this.half < this.len) {
      const i0 = Math.floor(this.pos);
      const p = Math.min(PHASES - 1, Math.round((this.pos - i0) * PHASES));
      const row = p * taps;
      const first = i0 - this.half + 1;
      let y = 0;
      for (let j = 0; j < taps; j++) y += this.buf[first + j] * this.table[row + j];
      const s = y < -1 ? -1 : y > 1 ? 1 : y;
      this.out[this.n++] = Math.round(s < 0 ? s * 32768 : s * 32767);
      if (this.n === this.chunk) this.post();
      this.pos += this.step;
    }
  }

  process(inputs) {
    const input = inputs[0];
    if (input && input.length > 0 && input[0].length > 0) {
      this.push(input[0]);
      this.resample();
    }
    return this.running;
  }
}

registerProcessor("pcm16k", Pcm16k);
