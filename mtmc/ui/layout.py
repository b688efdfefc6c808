"""The Gradio app: chat (with upload and the pictures), history, settings and status."""
from __future__ import annotations

import uuid

import gradio as gr

from mtmc.tools.paths import artifacts_dir
from mtmc.ui import history, services
from mtmc.ui.chat import Chat
from mtmc.ui.module_view import REPORT_PLACEHOLDER
from mtmc.ui.plots import TIMES_PLACEHOLDER
from mtmc.ui.settings import Settings, status_markdown, target_choices
from mtmc.ui.upload import MAX_UPLOAD_BYTES

TITLE = "MTMC Kernel Agent"
INTRO = ("Ask for a kernel in words (*softmax over the rows of a 4096x8192 fp16 tensor*), upload a "
         "PyTorch module (`class Model`, `get_inputs()`, `get_init_inputs()`) with the paperclip, "
         "then follow up (*use bf16*, *try it for 16384 columns*) or ask *why step 0?* (the first draft) "
         "or *why did you stop?*")
ROOFLINE_PLACEHOLDER = "<p>The roofline appears when a run finishes.</p>"
RUN_CONCURRENCY = 16   # sessions streaming at once; the runs themselves go one at a time (RunQueue)
# Tables in chat messages: headers break between words, never inside one, and a table wider
# than its bubble scrolls.
CSS = """
#chat .message-content table { display: block; max-width: 100%; overflow-x: auto; }
#chat .message-content th { word-break: normal; overflow-wrap: normal; hyphens: none; }
"""
# After an answer: bring the newest message into view (its top, when it is taller than the chat),
# also when the user had scrolled the chat up, where streaming would not follow.
SCROLL_JS = """() => { setTimeout(() => {
  const wrap = document.querySelector('#chat .bubble-wrap');
  const rows = wrap ? wrap.querySelectorAll('.message-row') : [];
  if (!rows.length) return;
  const last = rows[rows.length - 1];
  const offset = last.getBoundingClientRect().top - wrap.getBoundingClientRect().top;
  wrap.scrollTop = Math.min(wrap.scrollTop + offset - 8, wrap.scrollHeight - wrap.clientHeight);
}, 150); }"""


def build_app(defaults: Settings | None = None, chat: Chat | None = None) -> gr.Blocks:
    defaults = defaults or Settings.from_env()
    chat = chat or Chat()
    with gr.Blocks(title=TITLE, fill_width=True) as demo:
        thread = gr.State("")
        conversation = gr.State([])
        settings = gr.State(defaults.to_dict())
        gr.Markdown(f"## {TITLE}\n{INTRO}")
        with gr.Tabs():
            with gr.Tab("Chat", id="chat"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        chatbot = gr.Chatbot(label="Conversation", elem_id="chat", height=860,
                                             buttons=["copy", "copy_all"], group_consecutive_messages=False)
                        box = gr.MultimodalTextbox(elem_id="ask", file_types=[".py"], file_count="single",
                                                   placeholder="Ask for a kernel, attach a module (.py), or ask why...",
                                                   show_label=False, autofocus=True)
                        new = gr.Button("New conversation", size="sm", elem_id="new-conversation")
                    with gr.Column(scale=2):
                        code = gr.Code(label="Final kernel (ModelNew file for a module)", language="python", elem_id="kernel-code",
                                       interactive=False, lines=18, max_lines=30)
                        download = gr.DownloadButton("Download the kernel file", elem_id="download", size="md",
                                                     interactive=False)   # until a run wrote one
                        report = gr.HTML(REPORT_PLACEHOLDER, elem_id="report")
                        times = gr.HTML(TIMES_PLACEHOLDER, elem_id="times")
                        roofline = gr.HTML(ROOFLINE_PLACEHOLDER, elem_id="roofline")
            with gr.Tab("History", id="history"):
                with gr.Row():
                    query = gr.Textbox(label="Search past optimizations", placeholder="e.g. softmax fp16 on H200",
                                       elem_id="history-query", scale=4)
                    find = gr.Button("Search", scale=1)
                note = gr.Markdown()
                table = gr.Dataframe(headers=history.COLUMNS, interactive=False, elem_id="history-table")
                pick = gr.Dropdown(label="Open", choices=[], elem_id="history-pick")
                with gr.Row():
                    past_chat = gr.Chatbot(label="Steps", height=480, group_consecutive_messages=False)
                    past_code = gr.Code(label="Kernel", language="python", interactive=False)
            with gr.Tab("Settings", id="settings"):
                status = gr.Markdown(_status(defaults), elem_id="status")
                target = gr.Dropdown(target_choices(), value=defaults.target, label="Target GPU profile")
                max_steps = gr.Slider(0, 16, value=defaults.max_steps, step=1, label="Planner steps per run",
                                      elem_id="max-steps")
                tf32 = gr.Checkbox(value=defaults.allow_tf32, elem_id="allow-tf32",
                                   label="Allow TF32 in uploaded modules' fp32 conv and matmul groups (faster, "
                                         "TF32-sized error)")
                base_url = gr.Textbox(defaults.llm_base_url, label="LLM endpoint (OpenAI-compatible, optional)",
                                      placeholder="http://localhost:8000/v1")
                model = gr.Textbox(defaults.llm_model, label="LLM model", placeholder="e.g. Qwen/Qwen2.5-Coder-7B-Instruct")
                api_key = gr.Textbox(label="API key (kept in this session only)", type="password")
                save = gr.Button("Save settings", variant="primary")

        names = {"chat": chatbot, "thread": thread, "box": box, "code": code, "download": download,
                 "times": times, "roofline": roofline, "report": report}

        def respond(message, conv, thread_id, prefs):
            for update in chat.respond(message, conv, thread_id, prefs):
                out = {names[k]: v for k, v in update.items()}
                if "chat" in update:
                    out[conversation] = update["chat"]
                if "download" in update:
                    out[download] = _download(update["download"])
                yield out

        # trigger_mode "multiple": a message sent during a run reaches Chat.respond, which queues
        # it visibly (Gradio's default would drop it without a word).
        box.submit(respond, [box, conversation, thread, settings],
                   [chatbot, conversation, thread, box, code, download, times, roofline, report],
                   api_name="chat", concurrency_limit=RUN_CONCURRENCY, trigger_mode="multiple"
                   ).then(None, js=SCROLL_JS)

        def fresh():   # a new thread: follow-ups and why-questions start over
            return ([], [], uuid.uuid4().hex, None, _download(None), TIMES_PLACEHOLDER, ROOFLINE_PLACEHOLDER,
                    REPORT_PLACEHOLDER)

        cleared = [chatbot, conversation, thread, code, download, times, roofline, report]
        new.click(fresh, None, cleared, api_name="new_conversation")
        chatbot.clear(fresh, None, cleared, api_name=False)

        def save_settings(tgt, steps, url, mdl, key, allow_tf32, prev):
            # The key box starts empty (a key is never sent to the page): empty keeps the key held.
            prefs = Settings(target=tgt, max_steps=int(steps), llm_base_url=url or "", llm_model=mdl or "",
                             llm_api_key=key or Settings.from_dict(prev).llm_api_key, allow_tf32=bool(allow_tf32))
            return prefs.to_dict(), _status(prefs)

        save.click(save_settings, [target, max_steps, base_url, model, api_key, tf32, settings], [settings, status],
                   api_name="save_settings")
        demo.load(lambda prefs: _status(Settings.from_dict(prefs)), settings, status, api_name=False)
        # each page starts with its own conversation id, so two quick messages land in the same one
        demo.load(lambda tid: tid or uuid.uuid4().hex, thread, thread, api_name=False)

        def search(q):
            rows, ids, text = history.search(q)
            return rows, gr.update(choices=ids, value=None), text

        gr.on([find.click, query.submit], search, query, [table, pick, note], api_name="search_history")
        pick.change(history.open_record, pick, [past_chat, past_code], api_name="open_history")
    return demo


def _status(prefs: Settings) -> str:
    return status_markdown(prefs, services.availability())


def _download(path: str | None):
    """The download button holding `path`, usable only when there is one."""
    return gr.update(value=path, interactive=bool(path))


def launch_options(auth: list[tuple[str, str]] | None) -> dict:
    """Only the artifacts directory may be served as files; uploads are capped in size."""
    return {"allowed_paths": [str(artifacts_dir())], "max_file_size": MAX_UPLOAD_BYTES, "css": CSS,
            "auth": auth or None, "auth_message": "MTMC Kernel Agent: sign in" if auth else None}

