// The `helios` subcommands; each takes the arguments after its name and returns an exit code.
#pragma once

namespace helios::cli {

int cmd_generate(int argc, char** argv);
int cmd_calibrate(int argc, char** argv);
int cmd_profile(int argc, char** argv);
int cmd_score(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_convert_llama2c(int argc, char** argv);
int cmd_make_synthetic(int argc, char** argv);
#if defined(HELIOS_WITH_GRPC)
int cmd_complete(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_status(int argc, char** argv);
#endif

}  // namespace helios::cli
