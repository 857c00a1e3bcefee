'use strict';
// Node.js client for radixserve.v1.GenerateService.
//
// The .proto is loaded at run time from the repository's protos/ folder, so this client can
// never drift from the contract the gateway serves (there is no generated code to go stale).

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.resolve(__dirname, '..', '..', 'protos');
const DEFAULT_TARGET = '127.0.0.1:50051';

const definition = protoLoader.loadSync('radixserve/v1/generate.proto', {
  includeDirs: [PROTO_ROOT],
  keepCase: true, // field names as in the .proto (snake_case), as every other client sees them
  longs: Number, // uint64 seed/totals fit comfortably in a double here
  enums: String,
  defaults: true,
  oneofs: true, // adds `event` / `matched_stop` naming which oneof member is set
});
const v1 = grpc.loadPackageDefinition(definition).radixserve.v1;

const STATUS_NAMES = Object.fromEntries(Object.entries(grpc.status).map(([k, v]) => [v, k]));

// A failed call, carrying the gRPC status code (number) and its name.
class RadixServeError extends Error {
  constructor(code, details) {
    const codeName = STATUS_NAMES[code] || 'UNKNOWN';
    super(`${codeName}: ${details}`);
    this.name = 'RadixServeError';
    this.code = code;
    this.codeName = codeName;
    this.details = details;
  }

  static from(err) {
    return err && typeof err.code === 'number' ? new RadixServeError(err.code, err.details || '') : err;
  }
}

// Only options the caller set go on the wire, so the server's defaults apply to the rest
// (proto3 `optional` keeps an explicit 0 distinct from "unset").
function pick(source, names) {
  const out = {};
  for (const [key, field] of names) {
    if (source[key] !== undefined && source[key] !== null) out[field] = source[key];
  }
  return Object.keys(out).length ? out : undefined;
}

const SAMPLING = [
  ['temperature', 'temperature'], ['topP', 'top_p'], ['topK', 'top_k'], ['minP', 'min_p'],
  ['seed', 'seed'], ['repetitionPenalty', 'repetition_penalty'],
  ['frequencyPenalty', 'frequency_penalty'], ['presencePenalty', 'presence_penalty'],
  ['n', 'n'], // completions of one prompt: their delta and finished events carry `index`
];
const STOPPING = [
  ['maxNewTokens', 'max_new_tokens'], ['minNewTokens', 'min_new_tokens'], ['stop', 'stop'],
  ['stopTokenIds', 'stop_token_ids'], ['ignoreEos', 'ignore_eos'],
  ['includeStopStr', 'include_stop_str'],
];
// Structured output, at most one (the oneof `sampling.constraint`): jsonSchema is a JSON Schema
// (a string, or an object sent as JSON), regex a regular expression the whole output matches,
// ebnf a grammar (start rule `root`). One that does not compile fails with INVALID_ARGUMENT.
const CONSTRAINTS = [['jsonSchema', 'json_schema'], ['regex', 'regex'], ['ebnf', 'ebnf']];
const OPTIONS = [
  ['topLogprobs', 'top_logprobs'], ['logprobs', 'logprobs'], ['returnPromptInfo', 'return_prompt_info'],
];

// prompt: a string, { tokenIds: [...] }, or { messages: [{ role, content }, ...] }.
function buildRequest(prompt, opts = {}) {
  const req = { request_id: opts.requestId || '' };
  if (typeof prompt === 'string') req.text = prompt;
  else if (prompt && Array.isArray(prompt.tokenIds)) req.token_ids = { ids: prompt.tokenIds };
  else if (prompt && Array.isArray(prompt.messages)) req.chat = { messages: prompt.messages };
  else throw new TypeError('prompt must be a string, { tokenIds } or { messages }');
  const stop = typeof opts.stop === 'string' ? [opts.stop] : opts.stop;
  const constraint = pick(opts, CONSTRAINTS) || {};
  const given = Object.keys(constraint);
  if (given.length > 1) {
    throw new TypeError(`give at most one of jsonSchema, regex, ebnf (got ${given.join(', ')})`);
  }
  if (typeof constraint.json_schema === 'object') {
    constraint.json_schema = JSON.stringify(constraint.json_schema);
  }
  const sampling = pick(opts, SAMPLING) || (given.length ? {} : undefined);
  if (given.length) Object.assign(sampling, constraint);
  const stopping = pick({ ...opts, stop }, STOPPING);
  const options = pick(opts, OPTIONS);
  if (sampling) req.sampling = sampling;
  if (stopping) req.stopping = stopping;
  if (options) req.options = options;
  return req;
}

function toEvent(resp) {
  const requestId = resp.request_id;
  if (resp.event === 'started') {
    return { type: 'started', requestId, promptTokens: resp.started.prompt_tokens };
  }
  if (resp.event === 'delta') {
    const d = resp.delta;
    return {
      type: 'delta', requestId, index: resp.index, tokenIds: d.token_ids, text: d.text,
      logprobs: d.logprobs,
    };
  }
  if (resp.event === 'finished') {
    const f = resp.finished;
    return {
      type: 'finished',
      requestId,
      index: resp.index,
      finishReason: String(f.finish_reason).replace(/^FINISH_REASON_/, '').toLowerCase(),
      matchedStop: f.matched_stop ? f[f.matched_stop] : null,
      usage: f.usage,
      timings: f.timings,
    };
  }
  return null; // an event kind newer than this client: skip it
}

class GenerateClient {
  // connections: TCP connections to open. `serve --gateways K` gives each connection to one of
  // its K gateways, so a client reaches several only through several: generate() takes them in
  // turn, abort() asks every one (only the gateway that took a call knows its request), and the
  // other calls use the first.
  constructor(target = DEFAULT_TARGET, { apiKey, tls = false, rootCerts, connections = 1 } = {}) {
    if (!Number.isInteger(connections) || connections < 1) {
      throw new RangeError(`connections must be an integer of at least 1, got ${connections}`);
    }
    const creds = tls || rootCerts
      ? grpc.credentials.createSsl(rootCerts || null)
      : grpc.credentials.createInsecure();
    // Clients of one target share their connection unless each keeps its own subchannel pool.
    const options = connections > 1 ? { 'grpc.use_local_subchannel_pool': 1 } : {};
    this.target = target;
    this.stubs = Array.from({ length: connections }, () => new v1.GenerateService(target, creds, options));
    this.stub = this.stubs[0];
    this.turn = 0;
    this.apiKey = apiKey;
  }

  metadata() {
    const md = new grpc.Metadata();
    if (this.apiKey) md.set('authorization', `Bearer ${this.apiKey}`);
    return md;
  }

  callOptions(timeoutSeconds) {
    return timeoutSeconds ? { deadline: Date.now() + timeoutSeconds * 1000 } : {};
  }

  // Streams events: { type: 'started' | 'delta' | 'finished', ... }. Leaving the loop early,
  // or aborting `signal`, cancels the RPC so the server frees the request.
  async *generate(prompt, opts = {}) {
    const stub = this.stubs[this.turn++ % this.stubs.length];
    const call = stub.Generate(buildRequest(prompt, opts), this.metadata(), this.callOptions(opts.timeout));
    const cancel = () => call.cancel();
    if (opts.signal) opts.signal.addEventListener('abort', cancel, { once: true });
    try {
      for await (const resp of call) {
        const ev = toEvent(resp);
        if (ev) yield ev;
      }
    } catch (err) {
      throw RadixServeError.from(err);
    } finally {
      if (opts.signal) opts.signal.removeEventListener('abort', cancel);
      call.on('error', () => {}); // the CANCELLED status of our own cancel is expected
      call.cancel();
    }
  }

  // Runs one generation to the end: { text, tokenIds, finishReason, matchedStop, usage, timings, requestId }.
  async generateText(prompt, opts = {}) {
    if (opts.n !== undefined && opts.n !== null && opts.n !== 1) {
      throw new RangeError('generateText makes one completion; for n > 1 iterate generate(), '
        + 'whose delta and finished events carry index');
    }
    const out = { text: '', tokenIds: [], requestId: '' };
    let finished = null;
    for await (const ev of this.generate(prompt, opts)) {
      if (ev.type === 'started') out.requestId = ev.requestId;
      else if (ev.type === 'delta') {
        out.text += ev.text;
        out.tokenIds.push(...ev.tokenIds);
      } else finished = ev;
    }
    if (!finished) throw new RadixServeError(grpc.status.UNKNOWN, 'stream ended without a Finished event');
    const { finishReason, matchedStop, usage, timings } = finished;
    return { ...out, finishReason, matchedStop, usage, timings };
  }

  unary(method, request, timeoutSeconds, stub = this.stub) {
    return new Promise((resolve, reject) => {
      stub[method](request, this.metadata(), this.callOptions(timeoutSeconds), (err, resp) =>
        err ? reject(RadixServeError.from(err)) : resolve(resp));
    });
  }

  async tokenize(text, { timeout } = {}) {
    return (await this.unary('Tokenize', { text }, timeout)).token_ids;
  }

  async detokenize(tokenIds, { timeout } = {}) {
    return (await this.unary('Detokenize', { token_ids: tokenIds }, timeout)).text;
  }

  async abort(requestIds, { timeout } = {}) {
    const ids = Array.isArray(requestIds) ? requestIds : [requestIds];
    const replies = await Promise.all(
      this.stubs.map((stub) => this.unary('Abort', { request_ids: ids }, timeout, stub)));
    return replies.reduce((sum, r) => sum + Number(r.aborted), 0);
  }

  modelInfo({ timeout } = {}) {
    return this.unary('GetModelInfo', {}, timeout);
  }

  serverInfo({ timeout } = {}) {
    return this.unary('GetServerInfo', {}, timeout);
  }

  close() {
    for (const stub of this.stubs) stub.close();
  }
}

module.exports = { GenerateClient, RadixServeError, buildRequest, DEFAULT_TARGET, grpcStatus: grpc.status };
