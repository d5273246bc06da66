// A memgate client we did not write: @grpc/grpc-js, with the service discovered through server
// reflection (grpc-js-reflection-client, protocol v1) and nothing of ours (no .proto file, no
// generated code). Driven by tests/interop/test_node_client.py.
//
//   node client.js TARGET story    Write/Triage/Recall/History/Undo/ListEvents, health, errors
//   node client.js TARGET stream   a Backfill stream and a Health.Watch, until the server ends them
//
// Every result is one JSON line on stdout; "story" exits 1 on the first failed check.
"use strict";

const grpc = require("@grpc/grpc-js");
const { GrpcReflection } = require("grpc-js-reflection-client");

const [target, mode] = process.argv.slice(2);
const creds = grpc.credentials.createInsecure();
const LOADER = { keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true };
const NS = "interop/acme";

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function check(ok, what, detail) {
  emit({ check: what, ok: Boolean(ok), detail: detail === undefined ? null : detail });
  if (!ok) {
    process.exitCode = 1;
    throw new Error(`check failed: ${what}`);
  }
}

async function discover() {
  const reflection = new GrpcReflection(target, creds, {}, "v1");
  const services = await reflection.listServices();
  const memgate = (await reflection.getDescriptorBySymbol("memgate.v1.Memgate"))
    .getPackageObject(LOADER);
  const health = (await reflection.getDescriptorBySymbol("grpc.health.v1.Health"))
    .getPackageObject(LOADER);
  return {
    services,
    stub: new memgate.memgate.v1.Memgate(target, creds),
    health: new health.grpc.health.v1.Health(target, creds),
  };
}

// One unary call: resolves { response, requestId } or { error } (never rejects).
function unary(stub, method, request) {
  return new Promise((resolve) => {
    let requestId = null;
    const deadline = new Date(Date.now() + 60_000);
    const call = stub[method](request, new grpc.Metadata(), { deadline }, (error, response) => {
      resolve(error ? { error, requestId } : { response, requestId });
    });
    call.on("metadata", (md) => {
      const values = md.get("x-request-id");
      requestId = values.length ? String(values[0]) : null;
    });
  });
}

async function ok(stub, method, request) {
  const { response, error, requestId } = await unary(stub, method, request);
  check(!error, `${method} answers OK`, error ? `${error.code} ${error.details}` : requestId);
  return { response, requestId };
}

const fact = (text, extra = {}) => ({ namespace: NS, text: Buffer.from(text, "utf8"), ...extra });

async function story() {
  const { services, stub, health } = await discover();
  check(services.includes("memgate.v1.Memgate"), "reflection v1 lists memgate.v1.Memgate", services);
  check(services.includes("grpc.health.v1.Health"), "reflection v1 lists the health service");

  const serving = await ok(health, "Check", { service: "" });
  check(serving.response.status === "SERVING", "health says SERVING", serving.response.status);
  const scoped = await ok(health, "Check", { service: "memgate.v1.Memgate" });
  check(scoped.response.status === "SERVING", "the service's health says SERVING");

  const seed = await ok(stub, "Write", {
    facts: [
      fact("The customer's office is in Denver.", { idempotency_key: "node-1" }),
      fact("The customer prefers email over phone calls."),
    ],
  });
  const denver = seed.response.decisions[0];
  check(denver.action === "ADD" && denver.memory_id, "Write adds Denver", denver.action);
  check(seed.requestId, "x-request-id arrives in the initial metadata", seed.requestId);

  const dry = await ok(stub, "Triage", { facts: [fact("The customer's office is in Chicago.")] });
  const guess = dry.response.decisions[0];
  check(
    guess.action === "REPLACE" && guess.target_id === denver.memory_id && !guess.memory_id,
    "Triage decides Chicago replaces Denver, storing nothing",
    guess,
  );

  const wrote = await ok(stub, "Write", { facts: [fact("The customer's office is in Chicago.")] });
  const chicago = wrote.response.decisions[0];
  check(chicago.action === "REPLACE" && chicago.target_id === denver.memory_id, "Write replaces");
  check(wrote.response.timings.total > 0, "timings come back", wrote.response.timings);

  const replay = await ok(stub, "Write", {
    facts: [fact("The customer's office is in Denver.", { idempotency_key: "node-1" })],
  });
  check(replay.response.decisions[0].replayed, "an idempotency key replays the first write");

  const recall = await ok(stub, "Recall", {
    namespace: NS,
    query: Buffer.from("Where is the customer's office?"),
    k: 3,
  });
  check(recall.response.hits[0].memory.id === chicago.memory_id, "Recall finds Chicago first");

  const history = await ok(stub, "History", { namespace: NS, memory_id: chicago.memory_id });
  const chain = history.response.chain.map((m) => m.id);
  check(
    chain.length === 2 && chain[0] === denver.memory_id && chain[1] === chicago.memory_id,
    "History is Denver -> Chicago",
    chain,
  );

  const undo = await ok(stub, "Undo", { namespace: NS, memory_id: chicago.memory_id });
  check(
    undo.response.restored.id === denver.memory_id && undo.response.undone.status === "undone",
    "Undo restores Denver",
  );

  const events = await ok(stub, "ListEvents", { namespace: NS, after_seq: 0, limit: 100 });
  const types = events.response.events.map((e) => e.type);
  check(
    JSON.stringify(types) === JSON.stringify(["add", "add", "replace", "undo"]),
    "ListEvents is the audit log",
    types,
  );
  check(events.response.events[2].rule === chicago.rule, "events carry their rule");

  // Bad input: the right status, never UNKNOWN or INTERNAL.
  const bad = [
    ["Write", { facts: [{ namespace: "acme corp", text: Buffer.from("x") }] }, 3],
    ["Write", { facts: [{ namespace: "nltest\n", text: Buffer.from("x") }] }, 3],
    ["Get", { namespace: "acme corp", memory_id: "mem_x" }, 3],
    ["Get", { namespace: NS, memory_id: "mem_absent" }, 5],
    ["Write", { facts: [fact("")] }, 3],
    ["Recall", { namespace: NS, query: Buffer.from([0xff]), k: 1 }, 3],
    ["ListEvents", { namespace: NS, limit: 5000 }, 3],
  ];
  for (const [method, request, code] of bad) {
    const { error } = await unary(stub, method, request);
    check(
      error && error.code === code,
      `${method} ${JSON.stringify(request).slice(0, 60)} -> ${grpc.status[code]}`,
      error ? `${grpc.status[error.code]} ${error.details}` : "OK",
    );
  }
  stub.close();
  health.close();
  emit({ done: true });
}

// A Backfill stream fed one fact every 20 ms, and a Health.Watch, until the server ends both.
async function stream() {
  const { stub, health } = await discover();
  const ends = {};
  const finish = (name, code, details) => {
    if (ends[name]) return;
    ends[name] = true;
    emit({ end: name, code: grpc.status[code], details });
    if (ends.backfill && ends.watch) process.exit(0);
  };
  const watch = health.Watch({ service: "" });
  watch.on("data", (msg) => emit({ watch: msg.status }));
  watch.on("error", (err) => finish("watch", err.code, err.details));
  watch.on("end", () => finish("watch", grpc.status.OK, "ended without a status error"));

  const call = stub.Backfill();
  call.on("data", (msg) => emit({ decision: msg.decision.index, action: msg.decision.action }));
  call.on("error", (err) => finish("backfill", err.code, err.details));
  call.on("end", () => finish("backfill", grpc.status.OK, "ended without a status error"));
  let i = 0;
  const timer = setInterval(() => {
    if (ends.backfill || i >= 5000) {
      clearInterval(timer);
      return;
    }
    const text = `Interop episode ${i}: the customer called about order ${1000 + i}.`;
    const msg = { fact: { namespace: "interop/stream", text: Buffer.from(text), kind: "EPISODIC",
      idempotency_key: `stream-${i}` } };
    if (i === 0) msg.policy = "STRICT";
    try {
      call.write(msg);
    } catch (err) {
      clearInterval(timer);
    }
    i += 1;
  }, 20);
  setTimeout(() => {
    emit({ timeout: true });
    process.exit(3);
  }, 120_000);
}

const run = mode === "stream" ? stream : story;
run().catch((err) => {
  emit({ fatal: String(err && err.stack ? err.stack : err) });
  process.exit(process.exitCode || 2);
});
