#!/usr/bin/env node
'use strict';
// Stream one generation to stdout; the finish reason goes to stderr so stdout is just the text.
//   node clients/node/generate.js --target 127.0.0.1:50051 [--max-tokens N] [--temperature T] "prompt"

const { parseArgs } = require('util');
const { GenerateClient, DEFAULT_TARGET } = require('./index');

const USAGE = `usage: generate.js [--target H:P] [--api-key K] [--tls] [--max-tokens N]
                   [--temperature T] [--seed S] [--chat]
                   [--json-schema SCHEMA | --regex RE | --ebnf GRAMMAR] "prompt"`;

function parse(argv) {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      target: { type: 'string', default: process.env.RADIXSERVE_TARGET || DEFAULT_TARGET },
      'api-key': { type: 'string', default: process.env.RADIXSERVE_API_KEY },
      tls: { type: 'boolean', default: false },
      'max-tokens': { type: 'string' },
      temperature: { type: 'string' },
      seed: { type: 'string' },
      chat: { type: 'boolean', default: false }, // send the prompt as one user chat message
      'json-schema': { type: 'string' }, // structured output: at most one of these three
      regex: { type: 'string' },
      ebnf: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  const num = (v) => (v === undefined ? undefined : Number(v));
  return {
    help: values.help,
    target: values.target,
    client: { apiKey: values['api-key'], tls: values.tls },
    prompt: positionals.join(' '),
    chat: values.chat,
    options: {
      maxNewTokens: num(values['max-tokens']),
      temperature: num(values.temperature),
      seed: num(values.seed),
      jsonSchema: values['json-schema'],
      regex: values.regex,
      ebnf: values.ebnf,
    },
  };
}

async function main() {
  let args;
  try {
    args = parse(process.argv.slice(2));
  } catch (err) {
    console.error(`${err.message}\n${USAGE}`);
    return 2;
  }
  if (args.help || !args.prompt) {
    console.error(USAGE);
    return args.help ? 0 : 2;
  }
  const client = new GenerateClient(args.target, args.client);
  const controller = new AbortController();
  // Ctrl-C cancels the RPC (the server aborts the request) before exiting.
  process.once('SIGINT', () => controller.abort());
  const prompt = args.chat ? { messages: [{ role: 'user', content: args.prompt }] } : args.prompt;
  try {
    for await (const ev of client.generate(prompt, { ...args.options, signal: controller.signal })) {
      if (ev.type === 'delta') process.stdout.write(ev.text);
      else if (ev.type === 'finished') {
        process.stdout.write('\n');
        const u = ev.usage || {};
        console.error(`finish_reason: ${ev.finishReason} (completion ${u.completion_tokens} tokens, `
          + `prompt ${u.prompt_tokens}, cached ${u.cached_tokens})`);
      }
    }
    return 0;
  } catch (err) {
    if (controller.signal.aborted) return 130;
    const hint = err.codeName === 'UNAVAILABLE' ? ` (is radixserve running at ${args.target}?)` : '';
    console.error(`error: ${err.message}${hint}`);
    return 1;
  } finally {
    client.close();
  }
}

main().then((code) => { process.exitCode = code; });
