// Drives apiserver-lite with the official JavaScript client, @kubernetes/client-node, through
// the kubeconfig the test wrote (https, the lab CA's data, a bearer token).
// Usage: node client_check.mjs KUBECONFIG. Prints one line per step; exits non-zero on failure.
import * as k8s from '@kubernetes/client-node';

const step = (msg) => console.log(msg);
const kc = new k8s.KubeConfig();
kc.loadFromFile(process.argv[2]);
const core = kc.makeApiClient(k8s.CoreV1Api);
const apps = kc.makeApiClient(k8s.AppsV1Api);
const batch = kc.makeApiClient(k8s.BatchV1Api);

const namespaces = await core.listNamespace();
if (!namespaces.items.some((n) => n.metadata.name === 'kube-system')) throw new Error('no kube-system');
step(`namespaces: ${namespaces.items.length}`);

// A watch from now: the created Service arrives as ADDED.
const seen = [];
const watch = new k8s.Watch(kc);
const req = await watch.watch('/api/v1/namespaces/default/services', { allowWatchBookmarks: true },
  (type, obj) => seen.push(`${type} ${obj.metadata.name}`), () => {});

const svc = await core.createNamespacedService({
  namespace: 'default',
  body: { metadata: { name: 'node-web', labels: { app: 'node' } },
          spec: { type: 'NodePort', selector: { app: 'node' }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] } },
});
if (!(svc.spec.ports[0].nodePort >= 30000)) throw new Error(`no nodePort: ${JSON.stringify(svc.spec)}`);
step(`created service node-web: clusterIP ${svc.spec.clusterIP}, nodePort ${svc.spec.ports[0].nodePort}`);

const dep = await apps.createNamespacedDeployment({
  namespace: 'default',
  body: { metadata: { name: 'node-dep' },
          spec: { replicas: 2, selector: { matchLabels: { app: 'node' } },
                  template: { metadata: { labels: { app: 'node' } }, spec: { containers: [{ name: 'c', image: 'podpath/echo' }] } } } },
});
if (dep.status === undefined) throw new Error('a created Deployment has a status');
step(`created deployment node-dep (generation ${dep.metadata.generation})`);

const patched = await core.patchNamespacedService(
  { name: 'node-web', namespace: 'default', body: { metadata: { labels: { tier: 'web' } } } },
  k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch));
if (patched.metadata.labels.tier !== 'web') throw new Error('merge patch lost');
step('patched labels');

try {
  await core.readNamespacedService({ name: 'missing', namespace: 'default' });
  throw new Error('read of a missing Service succeeded');
} catch (e) {
  if (e.code !== 404) throw e;
  step('missing service: 404');
}

for (let i = 0; i < 50 && !seen.includes('ADDED node-web'); i++) await new Promise((r) => setTimeout(r, 100));
req.abort();
if (!seen.includes('ADDED node-web')) throw new Error(`watch saw ${seen}`);
step(`watch: ${seen.join(', ')}`);

// A Job's status as its controller writes it (no node runs its pod here: active, started).
await batch.createNamespacedJob({
  namespace: 'default',
  body: { metadata: { name: 'node-job' }, spec: { template: { spec: { restartPolicy: 'Never',
    containers: [{ name: 'c', image: 'busybox', command: ['true'] }] } } } },
});
let jobStatus;
for (let i = 0; i < 100; i++) {
  jobStatus = (await batch.readNamespacedJobStatus({ name: 'node-job', namespace: 'default' })).status;
  if (jobStatus?.active === 1 && jobStatus?.startTime) break;
  await new Promise((r) => setTimeout(r, 100));
}
if (jobStatus?.active !== 1 || !(jobStatus.startTime instanceof Date)) throw new Error(`job status: ${JSON.stringify(jobStatus)}`);
await batch.deleteNamespacedJob({ name: 'node-job', namespace: 'default', propagationPolicy: 'Background' });
step(`job: status read (active ${jobStatus.active}, started ${jobStatus.startTime.toISOString()})`);

// A StatefulSet's status as its controller writes it (its first pod made, not yet ready).
await apps.createNamespacedStatefulSet({
  namespace: 'default',
  body: { metadata: { name: 'node-sts' }, spec: { replicas: 2, serviceName: 'node-sts',
    selector: { matchLabels: { app: 'node-sts' } },
    template: { metadata: { labels: { app: 'node-sts' } }, spec: { containers: [{ name: 'c', image: 'podpath/echo' }] } } } },
});
let stsStatus;
for (let i = 0; i < 100; i++) {
  stsStatus = (await apps.readNamespacedStatefulSetStatus({ name: 'node-sts', namespace: 'default' })).status;
  if (stsStatus?.replicas === 1 && stsStatus?.updateRevision) break;
  await new Promise((r) => setTimeout(r, 100));
}
if (stsStatus?.replicas !== 1 || !stsStatus.updateRevision.startsWith('node-sts-')) throw new Error(`statefulset status: ${JSON.stringify(stsStatus)}`);
await apps.deleteNamespacedStatefulSet({ name: 'node-sts', namespace: 'default' });
step(`statefulset: status read (replicas ${stsStatus.replicas}, revision ${stsStatus.updateRevision})`);

// A continue token whose resourceVersion has left the server's event log: 410 Expired.
for (let i = 0; i < 3; i++) {
  await core.createNamespacedConfigMap({ namespace: 'default', body: { metadata: { name: `node-page-${i}` } } });
}
const first = await core.listNamespacedConfigMap({ namespace: 'default', limit: 2 });
const token = first.metadata?._continue;
if (!token) throw new Error(`no continue token: ${JSON.stringify(first.metadata)}`);
for (let i = 0; i < 60; i++) {
  await core.patchNamespacedConfigMap({ name: 'node-page-0', namespace: 'default', body: { data: { n: `${i}` } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch));
}
let expired;
try {
  await core.listNamespacedConfigMap({ namespace: 'default', limit: 2, _continue: token });
} catch (e) {
  expired = e;
}
if (expired?.code !== 410 || !String(expired.body).includes('"reason":"Expired"')) throw new Error(`expired token: ${expired}`);
for (let i = 0; i < 3; i++) await core.deleteNamespacedConfigMap({ name: `node-page-${i}`, namespace: 'default' });
step('an expired continue token: 410 Expired');

await core.deleteNamespacedService({ name: 'node-web', namespace: 'default' });
await apps.deleteNamespacedDeployment({ name: 'node-dep', namespace: 'default' });
step('deleted');
console.log('node client: ok');
