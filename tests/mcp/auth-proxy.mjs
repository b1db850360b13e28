// A loopback HTTP proxy that adds `Authorization: Bearer TOKEN` to every request it forwards
// to TARGET (host:port), streaming both ways (SSE included), headers otherwise untouched
// (Host and Origin too). The MCP conformance suite has no option to send a token; this lets
// it test toolgrid's authenticated /mcp as an agent.
//
//   node tests/mcp/auth-proxy.mjs TARGET TOKEN     prints "listening PORT"
import http from 'node:http';

const [target, token] = process.argv.slice(2);
const [host, port] = target.split(':');
const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${token}` };
  const upstream = http.request({ host, port: Number(port), method: req.method, path: req.url, headers }, (up) => {
    res.writeHead(up.statusCode, up.headers);
    up.pipe(res);
  });
  upstream.on('error', () => {
    res.writeHead(502);
    res.end();
  });
  res.on('close', () => upstream.destroy());
  req.pipe(upstream);
});
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
