// @kubernetes/client-node's streaming calls against a podpath lab: Exec (output, exit status),
// the pod log, and PortForward behind a local TCP server.
// Usage: node stream_check.mjs KUBECONFIG. The lab runs pod `web` (podpath/echo on 8080) and
// `ticker` (prints `tick N`). Prints one line per step; exits non-zero on failure.
import * as k8s from '@kubernetes/client-node';
import * as net from 'node:net';
import * as http from 'node:http';
import { PassThrough } from 'node:stream';

const step = (msg) => console.log(msg);
const kc = new k8s.KubeConfig();
kc.loadFromFile(process.argv[2]);
const core = kc.makeApiClient(k8s.CoreV1Api);

const collect = () => {
  const s = new PassThrough();
  s.text = '';
  s.on('data', (d) => { s.text += d.toString(); });
  return s;
};

async function exec(command) {
  const [out, err] = [collect(), collect()];
  const status = await new Promise((resolve, reject) => {
    new k8s.Exec(kc).exec('default', 'web', 'web', command, out, err, null, false, resolve).catch(reject);
  });
  return { status, out: out.text, err: err.text };
}

let r = await exec(['sh', '-c', 'echo node-$((2+2)); echo warn >&2']);
if (r.out.trim() !== 'node-4' || r.err.trim() !== 'warn' || r.status.status !== 'Success') {
  throw new Error(`exec: ${JSON.stringify(r)}`);
}
step('exec: output and Success');
r = await exec(['sh', '-c', 'exit 5']);
if (r.status.reason !== 'NonZeroExitCode' || r.status.details.causes[0].message !== '5') {
  throw new Error(`exec exit code: ${JSON.stringify(r.status)}`);
}
step('exec: exit code 5');

const log = await core.readNamespacedPodLog({ name: 'ticker', namespace: 'default', tailLines: 2 });
const lines = log.trim().split('\n');
if (lines.length !== 2 || !lines.every((l) => l.startsWith('tick '))) throw new Error(`log: ${log}`);
step(`log: ${JSON.stringify(lines)}`);

const forward = new k8s.PortForward(kc);
const server = net.createServer((socket) => {
  forward.portForward('default', 'web', [8080], socket, null, socket).catch((e) => socket.destroy(e));
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const body = await new Promise((resolve, reject) => {
  http.get({ host: '127.0.0.1', port: server.address().port, path: '/', agent: false }, (res) => {
    let b = '';
    res.on('data', (d) => { b += d; });
    res.on('end', () => resolve(b));
  }).on('error', reject);
});
server.close();
if (!body.includes('pod: default/web')) throw new Error(`port-forward: ${body}`);
step('port-forward: an HTTP request to 8080');
console.log('node streaming: ok');
process.exit(0);
