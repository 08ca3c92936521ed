// One line for a person about a failed request to the Kubernetes API, the
// same from every command, whichever client made the request:
// - KubeApiError (../api/kube-http.ts): "HTTP <code>: <the Status's message>";
// - @kubernetes/client-node's ApiException (its `code` and the response
//   `body`, a metav1.Status as JSON text or parsed): the same form;
// - a transport failure (fetch's TypeError "fetch failed", Node's
//   ECONNREFUSED...): its message and its cause's code or message, which
//   say what a person can act on ("fetch failed" alone does not);
// - anything else: its message.
import { KubeApiError } from '../api/kube-http.ts';

export function apiError(err: unknown): string {
  if (err instanceof KubeApiError) return err.message;
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'number') {
    const body = (err as { body?: unknown }).body;
    let detail = '';
    try {
      const parsed = typeof body === 'string' ? JSON.parse(body) : body;
      if (parsed && typeof parsed.message === 'string') detail = parsed.message;
    } catch {
      // not a Status object
    }
    return `HTTP ${code}${detail ? `: ${detail}` : ''}`;
  }
  const e = err as { message?: unknown; cause?: { message?: unknown; code?: unknown } } | null;
  const cause = e?.cause?.code ?? e?.cause?.message;
  return `${String(e?.message ?? err)}${cause ? ` (${String(cause)})` : ''}`;
}
