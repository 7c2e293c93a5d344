/**
 * Permission rules that say `ask`, answered by the person behind the MCP
 * client: the server sends an elicitation request (the client shows it and
 * answers accept, decline or cancel). A client that did not declare the
 * elicitation capability cannot be asked, so the call is denied, and the
 * denial says why.
 */
import type { Server } from "@modelcontextprotocol/sdk/server/index.js";
import type { AskCallback, PermissionDecision, PermissionRequest } from "../core/permissions.js";

/** Paths a question lists; the rest are counted. */
const LISTED_PATHS = 20;

/**
 * What the person is asked: the operation, the path (or, for a search or a
 * batch, the files: one question for them all), the command or the change,
 * and the rule that asks.
 */
function question(request: PermissionRequest): string {
  const rule = request.rule.name ? `the rule '${request.rule.name}'` : "a permission rule";
  const detail = request.input.command !== undefined ? `: ${request.input.command}` : "";
  const paths = request.paths ?? [request.path];
  if (paths.length <= 1) return `Allow ${request.operation} (${request.method}) on ${request.path}${detail}? Asked by ${rule}.`;
  const more = paths.length > LISTED_PATHS ? ` and ${paths.length - LISTED_PATHS} more` : "";
  return `Allow ${request.operation} (${request.method}) of ${paths.length} files: ${paths.slice(0, LISTED_PATHS).join(", ")}${more}? Asked by ${rule}; one answer for all of them.`;
}

/** An ask callback that puts each question to the client connected to `server` (read when asked, so one callback serves the session). */
export function elicitationAsk(server: () => Server | undefined): AskCallback {
  return async (request): Promise<PermissionDecision> => {
    const current = server();
    if (!current?.getClientCapabilities()?.elicitation) {
      return { behavior: "deny", message: "this rule asks for approval and the MCP client cannot be asked (it does not support elicitation)" };
    }
    const answer = await current.elicitInput({
      message: question(request),
      requestedSchema: { type: "object", properties: { allow: { type: "boolean", title: "Allow", default: true } } },
    });
    if (answer.action === "accept" && answer.content?.allow !== false) return true;
    return { behavior: "deny", message: answer.action === "cancel" ? "the approval request was dismissed" : "the user declined" };
  };
}
