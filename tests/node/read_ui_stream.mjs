// Reads a UI message stream from a URL with the ai package's own reader, as useChat does,
// and prints what it saw as JSON: the status and headers, every chunk, the errors the
// reader reported and the final assistant message.
import { parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } from 'ai';

const url = process.argv[2];
const response = await fetch(url, { headers: JSON.parse(process.argv[3] || '{}') });
const headers = Object.fromEntries(response.headers);
const chunks = [];
const errors = [];
let message = null;
if (response.body && response.status === 200) {
  const parsed = parseJsonEventStream({ stream: response.body, schema: uiMessageChunkSchema });
  const checked = parsed.pipeThrough(new TransformStream({
    transform(result, controller) {
      if (!result.success) {
        throw result.error;
      }
      chunks.push(result.value);
      controller.enqueue(result.value);
    },
  }));
  for await (const snapshot of readUIMessageStream({
    stream: checked,
    onError: (error) => errors.push(String(error && error.message ? error.message : error)),
  })) {
    message = snapshot;
  }
}
console.log(JSON.stringify({ status: response.status, headers, chunks, errors, message }));
