/* code: the built-in tool for code mode. It is the js tool (../js/js.c) with the agent's
 * tools as `tools.<tool>.<command>(args)`, reached through the host's tool door
 * (`toolgrid.tool_call`, `tool_wait`, `tool_take`; docs/host-abi.md, docs/code-mode.md). */
#define TOOLGRID_CODE 1
#include "../js/js.c"
