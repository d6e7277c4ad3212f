// A /v1 request as a person would send it themselves: curl, and Python with the openai SDK. The key
// is never written in: both read it from $LLMGW_API_KEY.

/** A JSON value as a Python literal (True/False/None, dicts and lists), indented like json.dumps(indent=4). */
export function pyLiteral(value, indent = 0) {
  const pad = " ".repeat(indent + 4);
  const end = " ".repeat(indent);
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return String(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return `[\n${value.map((v) => pad + pyLiteral(v, indent + 4)).join(",\n")},\n${end}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return "{}";
  return `{\n${entries.map(([k, v]) => `${pad}${JSON.stringify(k)}: ${pyLiteral(v, indent + 4)}`).join(",\n")},\n${end}}`;
}

const quoted = (text) => `'${text.replace(/'/g, "'\\''")}'`;

/** `curl` posting `body` to `base`/v1`path`. */
export function curl(base, path, body) {
  return [
    `curl ${base}/v1${path}${body.stream ? " -N" : ""} \\`,
    '  -H "Authorization: Bearer $LLMGW_API_KEY" \\',
    '  -H "Content-Type: application/json" \\',
    `  -d ${quoted(JSON.stringify(body, null, 2))}`,
  ].join("\n");
}

const CALLS = {
  "/chat/completions": "client.chat.completions.create",
  "/embeddings": "client.embeddings.create",
  "/responses": "client.responses.create",
  "/images/generations": "client.images.generate",
};

/** The same request with the openai SDK. */
export function python(base, path, body) {
  const args = Object.entries(body).map(([k, v]) => `    ${k}=${pyLiteral(v, 4)},`);
  const lines = [
    ...(path === "/images/generations" ? ["import base64"] : []),
    "import os",
    "",
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url="${base}/v1", api_key=os.environ["LLMGW_API_KEY"])`,
    `answer = ${CALLS[path]}(`,
    ...args,
    ")",
  ];
  if (path === "/images/generations") lines.push('with open("picture.png", "wb") as out:', "    out.write(base64.b64decode(answer.data[0].b64_json))");
  else if (path === "/embeddings") lines.push("print(len(answer.data[0].embedding), answer.data[0].embedding[:8])");
  else if (path === "/responses" && body.stream) lines.push("for event in answer:", '    if event.type == "response.output_text.delta":', '        print(event.delta, end="", flush=True)', "print()");
  else if (path === "/responses") lines.push("print(answer.output_text)");
  else if (body.stream) lines.push("for chunk in answer:", "    if chunk.choices:", '        print(chunk.choices[0].delta.content or "", end="", flush=True)', "print()");
  else lines.push("print(answer.choices[0].message)");
  return lines.join("\n");
}
