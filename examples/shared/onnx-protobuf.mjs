// Drops named initializers from an ONNX model's main graph, reading and writing just enough
// of the protocol buffers wire format to do it.
//
// Why: the export gives each search option (beam_size, ...) a default as an initializer of
// the same name, so that a caller may leave it out. ONNX Runtime's JavaScript packages list
// only the inputs without one (onnxruntime-web refuses a feed for any other input,
// onnxruntime-node ignores it), so the page and Node.js turn the options back into plain
// inputs and always give them all (model.json's defaults where the user asked nothing), and
// the target prefix too for a model whose targets start with their language's token
// (`alwaysFed` in exported-model.mjs).

// Field numbers in onnx.proto.
const MODEL_GRAPH = 7; // ModelProto.graph
const GRAPH_INITIALIZER = 5; // GraphProto.initializer, repeated TensorProto
const TENSOR_NAME = 8; // TensorProto.name
const LENGTH_DELIMITED = 2; // the wire type of messages, strings and bytes

function readVarint(bytes, offset) {
  let value = 0;
  let scale = 1;
  let byte;
  do {
    byte = bytes[offset++];
    value += (byte & 0x7f) * scale;
    scale *= 128;
  } while (byte & 0x80);
  return [value, offset];
}

function varint(value) {
  const bytes = [];
  for (; value >= 128; value = Math.floor(value / 128)) bytes.push((value % 128) | 128);
  bytes.push(value);
  return Uint8Array.from(bytes);
}

// The fields of a message, in order: each with its number, its bytes as written (key
// included) and, for a length-delimited field, its payload.
function fields(message) {
  const found = [];
  let offset = 0;
  while (offset < message.length) {
    const start = offset;
    let key;
    let payload = null;
    [key, offset] = readVarint(message, offset);
    const wireType = key % 8;
    if (wireType === 0) offset = readVarint(message, offset)[1];
    else if (wireType === 1) offset += 8;
    else if (wireType === 5) offset += 4;
    else if (wireType === LENGTH_DELIMITED) {
      let length;
      [length, offset] = readVarint(message, offset);
      payload = message.subarray(offset, offset + length);
      offset += length;
    } else throw new Error(`not an ONNX model (protobuf wire type ${wireType})`);
    found.push({ number: Math.floor(key / 8), bytes: message.subarray(start, offset), payload });
  }
  return found;
}

function concatenate(parts) {
  const joined = new Uint8Array(parts.reduce((total, part) => total + part.length, 0));
  let offset = 0;
  for (const part of parts) {
    joined.set(part, offset);
    offset += part.length;
  }
  return joined;
}

function tensorName(tensor) {
  const name = fields(tensor).find((field) => field.number === TENSOR_NAME);
  return name ? new TextDecoder().decode(name.payload) : null;
}

// `model` (bytes of a ModelProto) without the main graph's initializers named in `names`.
export function dropInitializers(model, names) {
  const parts = fields(model).map((field) => {
    if (field.number !== MODEL_GRAPH) return field.bytes;
    const graph = concatenate(
      fields(field.payload)
        .filter((f) => !(f.number === GRAPH_INITIALIZER && names.includes(tensorName(f.payload))))
        .map((f) => f.bytes),
    );
    return concatenate([varint(MODEL_GRAPH * 8 + LENGTH_DELIMITED), varint(graph.length), graph]);
  });
  return concatenate(parts);
}
