// src/cli/api-error.ts: one line per failed API request, the same from
// every command, whichever client made the request.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ApiException } from '@kubernetes/client-node';
import { KubeApiError } from '../../src/api/kube-http.ts';
import { apiError } from '../../src/cli/api-error.ts';

const status = { kind: 'Status', apiVersion: 'v1', status: 'Failure', message: 'nodes is forbidden: User "jane" cannot list resource "nodes"', reason: 'Forbidden', code: 403 };

describe('apiError', () => {
  test('the pinset HTTP client\'s error: its message, which carries the code and the Status\'s message', () => {
    assert.equal(apiError(new KubeApiError(403, `HTTP 403: ${status.message}`, 'Forbidden')), `HTTP 403: ${status.message}`);
  });

  test("client-node's ApiException: the code and the Status's message, from a body as text or parsed", () => {
    assert.equal(apiError(new ApiException(403, 'HTTP-Code: 403 Message: Unknown API Status Code!', JSON.stringify(status), {})), `HTTP 403: ${status.message}`);
    assert.equal(apiError(new ApiException(403, 'x', status, {})), `HTTP 403: ${status.message}`);
    assert.equal(apiError(new ApiException(502, 'x', '<html>bad gateway</html>', {})), 'HTTP 502', 'a body that is not a Status adds nothing');
  });

  test('a transport failure: its message and the cause a person can act on', () => {
    assert.equal(apiError(new TypeError('fetch failed', { cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6443'), { code: 'ECONNREFUSED' }) })), 'fetch failed (ECONNREFUSED)');
    assert.equal(apiError(new TypeError('fetch failed', { cause: new Error('certificate has expired') })), 'fetch failed (certificate has expired)');
    assert.equal(apiError(new Error('no answer within 15000ms while listing pods')), 'no answer within 15000ms while listing pods');
    assert.equal(apiError('plain'), 'plain');
  });
});
