/* A real LiteRT external-delegate plugin that claims no nodes.
 *
 * Loaded with load_delegate() exactly like a vendor GPU/NPU delegate, it lets the tests
 * exercise the delegate path (load, apply, record, fall back) on a machine with no GPU.
 * Built with -DFAIL_PREPARE it refuses every graph, like a delegate that cannot run a model.
 * The struct mirrors TfLiteDelegate in tensorflow/lite/core/c/common.h.
 */
#include <stdint.h>
#include <stdlib.h>

typedef struct TfLiteDelegate {
  void* data_;
  int (*Prepare)(void* context, struct TfLiteDelegate* delegate);
  void* CopyFromBufferHandle;
  void* CopyToBufferHandle;
  void* FreeBufferHandle;
  int64_t flags;
  void* opaque_delegate_builder;
} TfLiteDelegate;

static int prepare_calls = 0;

static int prepare(void* context, TfLiteDelegate* delegate) {
  (void)context;
  (void)delegate;
  prepare_calls++;
#ifdef FAIL_PREPARE
  return 1; /* kTfLiteError */
#else
  return 0; /* kTfLiteOk: no node replaced, the CPU kernels run everything */
#endif
}

int noop_delegate_prepare_calls(void) { return prepare_calls; }

TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n, void (*report_error)(const char*)) {
  (void)keys;
  (void)values;
  (void)n;
  (void)report_error;
  TfLiteDelegate* delegate = calloc(1, sizeof(TfLiteDelegate));
  if (delegate) delegate->Prepare = prepare;
  return delegate;
}

void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) { free(delegate); }
