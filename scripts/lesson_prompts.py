"""The lesson's prompts (`specdemo.app.lesson`) as the bench's JSONL, one a step with a method,
so that `python -m specdemo.bench --prompts build/lesson.jsonl` measures what docs/lesson.md says:

    python scripts/lesson_prompts.py > build/lesson.jsonl
"""

import json

from specdemo.app.lesson import LESSON

if __name__ == "__main__":
    seen = set()
    for number, step in enumerate(LESSON, start=1):  # the category: the first lesson step that uses the prompt
        if step.prompt not in seen:
            seen.add(step.prompt)
            print(json.dumps({"question_id": len(seen), "category": f"step {number}", "turns": [step.prompt]}))
