/**
 * A MIME type from a file name, for `read`'s answer. A short table of what
 * agents meet in a workspace; anything else is text/plain or
 * application/octet-stream by content.
 */
const TYPES: Record<string, string> = {
  md: "text/markdown",
  html: "text/html",
  htm: "text/html",
  css: "text/css",
  csv: "text/csv",
  js: "text/javascript",
  mjs: "text/javascript",
  cjs: "text/javascript",
  ts: "text/x-typescript",
  tsx: "text/x-typescript",
  py: "text/x-python",
  sh: "text/x-shellscript",
  json: "application/json",
  xml: "application/xml",
  yaml: "application/yaml",
  yml: "application/yaml",
  toml: "application/toml",
  svg: "image/svg+xml",
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  pdf: "application/pdf",
  zip: "application/zip",
  gz: "application/gzip",
  tar: "application/x-tar",
  wasm: "application/wasm",
  mp3: "audio/mpeg",
  wav: "audio/wav",
  mp4: "video/mp4",
};

export function mimeTypeOf(path: string, isText: boolean): string {
  const name = path.slice(path.lastIndexOf("/") + 1);
  const dot = name.lastIndexOf(".");
  const known = dot > 0 ? TYPES[name.slice(dot + 1).toLowerCase()] : undefined;
  if (known) return known;
  return isText ? "text/plain" : "application/octet-stream";
}
